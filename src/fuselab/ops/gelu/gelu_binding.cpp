// Torch side of the GELU CUDA kernels: checks tensors, allocates the output, launches on the current stream.
// Two entry points to the same code: the Python module's forward/backward (the eager path calls them directly) and
// the CUDA kernels of the ops fuselab::gelu_cuda / fuselab::gelu_cuda_backward, whose schemas, fakes and autograd
// Python defines (fuselab.ops.library); registering them here lets the dispatcher reach C++ without Python.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "../_cuda/fast_call.h"
#include "gelu.h"

namespace {

using fuselab::gelu::DType;
using fuselab::gelu::Form;

DType dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return DType::kFloat32;
    case at::kHalf:
      return DType::kFloat16;
    case at::kBFloat16:
      return DType::kBFloat16;
    default:
      TORCH_CHECK_TYPE(false, "gelu cuda: dtype ", t.scalar_type(),
                       " is not supported; accepted: float32, float16, bfloat16");
  }
  return DType::kFloat32;  // unreachable
}

void check_input(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), "gelu cuda: ", name, " is on ", t.device(), ", but this implementation runs on cuda only");
}

// t's dimensions from the largest stride to the smallest (ties in their order): t.permute(order) is contiguous for
// every tensor at::empty_like makes.
std::vector<int64_t> layout_order(const at::Tensor& t) {
  std::vector<int64_t> order(t.dim());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&t](int64_t a, int64_t b) { return t.stride(a) > t.stride(b); });
  return order;
}

// t read as rows of its last dimension (fuselab::gelu::Rows), with the tensor that holds them: t itself, or a
// contiguous copy where t's leading dimensions do not merge into rows of one stride. rows: their count.
struct RowsOf {
  at::Tensor held;
  fuselab::gelu::Rows rows;
  int64_t count;
};

RowsOf rows_of(const at::Tensor& t) {
  int64_t count = 1, row_stride = 0, inner = 0;  // inner: the stride the next dimension out must have
  for (int64_t d = t.dim() - 2; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (count > 1 && t.stride(d) != inner) return rows_of(t.contiguous());
    if (count == 1) row_stride = t.stride(d);
    inner = t.stride(d) * t.size(d);
    count *= t.size(d);
  }
  const int64_t col_stride = t.dim() > 0 ? t.stride(-1) : 1;
  return {t, {t.data_ptr(), row_stride, col_stride}, count};
}

int64_t cols_of(const at::Tensor& t) { return t.dim() > 0 ? t.size(-1) : 1; }

void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, "gelu cuda: ", what, " kernel launch failed: ", cudaGetErrorString(err));
}

Form form_of(bool tanh) { return tanh ? Form::kTanh : Form::kErf; }

}  // namespace

// y = gelu(x); x: CUDA tensor of any shape and layout (float32/float16/bfloat16); y: same shape and dtype, laid
// out as at::empty_like(x) (x's strides where x is dense, as F.gelu's). A dense x is one flat run of memory; other
// layouts are read through their strides (rows_of) into the contiguous y.
at::Tensor forward_tensor(const at::Tensor& x, bool tanh) {
  check_input(x, "x");
  const DType dtype = dtype_of(x);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty_like(x);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  if (x.strides() == y.strides() && x.is_non_overlapping_and_dense()) {
    check_launch(fuselab::gelu::gelu_forward(x.data_ptr(), y.data_ptr(), x.numel(), dtype, form_of(tanh), stream),
                 "forward");
    return y;
  }
  const auto order = layout_order(y);
  const RowsOf xr = rows_of(x.permute(order));
  check_launch(fuselab::gelu::gelu_forward_rows(xr.rows, y.data_ptr(), xr.count, cols_of(xr.held), dtype,
                                                form_of(tanh), stream),
               "forward (rows)");
  return y;
}

// dx = dy * gelu'(x); dy, x: CUDA tensors of the same shape, dtype and device, any layouts; dx laid out as x's
// forward output. Flat where dy, x and dx share one dense layout; else read as rows, as forward_tensor.
at::Tensor backward_tensor(const at::Tensor& dy, const at::Tensor& x, bool tanh) {
  check_input(dy, "dy");
  check_input(x, "x");
  TORCH_CHECK(dy.sizes() == x.sizes() && dy.scalar_type() == x.scalar_type() && dy.device() == x.device(),
              "gelu cuda: dy and x must have the same shape, dtype and device");
  const DType dtype = dtype_of(x);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor dx = at::empty_like(x);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  if (x.strides() == dx.strides() && dy.strides() == dx.strides() && x.is_non_overlapping_and_dense()) {
    check_launch(fuselab::gelu::gelu_backward(dy.data_ptr(), x.data_ptr(), dx.data_ptr(), x.numel(), dtype,
                                              form_of(tanh), stream),
                 "backward");
    return dx;
  }
  const auto order = layout_order(dx);
  const RowsOf dyr = rows_of(dy.permute(order));
  const RowsOf xr = rows_of(x.permute(order));
  check_launch(fuselab::gelu::gelu_backward_rows(dyr.rows, xr.rows, dx.data_ptr(), xr.count, cols_of(xr.held), dtype,
                                                 form_of(tanh), stream),
               "backward (rows)");
  return dx;
}

namespace {

bool is_tanh(c10::string_view approximate) {
  TORCH_CHECK(approximate == "tanh" || approximate == "none", "gelu cuda: approximate='", approximate,
              "' is not a GELU form; accepted: 'tanh', 'none' (erf)");
  return approximate == "tanh";
}

// fuselab::gelu_cuda(Tensor x, str approximate) -> Tensor: any layout.
at::Tensor gelu_op(const at::Tensor& x, c10::string_view approximate) {
  return forward_tensor(x, is_tanh(approximate));
}

// fuselab::gelu_cuda_backward(Tensor dy, Tensor x, str approximate) -> Tensor
at::Tensor gelu_backward_op(const at::Tensor& dy, const at::Tensor& x, c10::string_view approximate) {
  return backward_tensor(dy, x, is_tanh(approximate));
}

// The eager autograd of the op, in C++: the backward runs on autograd's device thread without taking Python's lock
// (a Python autograd.Function costs some 40 us more a forward + backward on the H200's host). x: any layout.
class GeluFunction : public torch::autograd::Function<GeluFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, bool tanh) {
    ctx->save_for_backward({x});
    ctx->saved_data["tanh"] = tanh;
    return forward_tensor(x, tanh);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const bool tanh = ctx->saved_data["tanh"].toBool();
    return {backward_tensor(grads[0], x, tanh), at::Tensor()};
  }
};

at::Tensor forward_with_grad(const at::Tensor& x, bool tanh) { return GeluFunction::apply(x, tanh); }

// The ops as the dispatcher sees them, for a kernel that calls them below autograd.
const c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, c10::string_view)>& gelu_cuda_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("fuselab::gelu_cuda", "")
                             .typed<at::Tensor(const at::Tensor&, c10::string_view)>();
  return op;
}

const c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>&
gelu_cuda_backward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("fuselab::gelu_cuda_backward", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>();
  return op;
}

// fuselab::gelu_cuda's autograd on CUDA tensors (its AutogradCUDA kernel): the op and its backward op called through
// the dispatcher below autograd, so torch.compile's tracing sees both as ops, and compiled code runs them without
// Python (the Autograd kernel that Python's register_autograd gives the op yields to this one on CUDA tensors).
class GeluOpFunction : public torch::autograd::Function<GeluOpFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, c10::string_view approximate) {
    ctx->save_for_backward({x});
    ctx->saved_data["approximate"] = std::string(approximate);
    const at::AutoDispatchBelowADInplaceOrView below;
    return gelu_cuda_op().call(x, approximate);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const std::string approximate = ctx->saved_data["approximate"].toStringRef();
    return {gelu_cuda_backward_op().call(grads[0], ctx->get_saved_variables()[0], approximate), at::Tensor()};
  }
};

at::Tensor gelu_autograd(const at::Tensor& x, c10::string_view approximate) {
  return GeluOpFunction::apply(x, approximate);
}

// The op's eager call, whole (fuselab.ops.library's `fast` entry): gelu_cuda(x, approximate) for an x of any layout
// that its Python check accepts and approximate "none" or "tanh" given; with autograd's graph where x needs one.
at::Tensor fast_gelu(PyObject* args, PyObject* kwargs) {
  namespace fc = fuselab::fast_call;
  PyObject* values[2];
  if (!fc::bind(args, kwargs, {"x", "approximate"}, values)) return {};
  const at::Tensor* x = fc::cuda_float(values[0]);
  const int form = fc::choice(values[1], {"none", "tanh"});
  if (x == nullptr || form < 0) return {};
  return fc::needs_grad(*x) ? forward_with_grad(*x, form == 1) : forward_tensor(*x, form == 1);
}

}  // namespace

TORCH_LIBRARY_IMPL(fuselab, CUDA, m) {
  m.impl("gelu_cuda", &gelu_op);
  m.impl("gelu_cuda_backward", &gelu_backward_op);
}

TORCH_LIBRARY_IMPL(fuselab, AutogradCUDA, m) {
  m.impl("gelu_cuda", &gelu_autograd);
  m.impl("gelu_cuda_backward", torch::autograd::autogradNotImplementedFallback());  // no second derivative
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward_tensor, "GELU forward (x, tanh: bool) -> y", pybind11::arg("x"),
        pybind11::arg("tanh"));
  m.def("backward", &backward_tensor, "GELU backward (dy, x, tanh: bool) -> dx", pybind11::arg("dy"),
        pybind11::arg("x"), pybind11::arg("tanh"));
  m.def("forward_with_grad", &forward_with_grad, "GELU forward with its backward attached in C++ (x, tanh) -> y",
        pybind11::arg("x"), pybind11::arg("tanh"));
  m.add_object("fast", pybind11::reinterpret_steal<pybind11::object>(fuselab::fast_call::function<fast_gelu>(
                           "fast", "fast(args, kwargs) -> y, or None: gelu_cuda's eager call, whole")));
}
