// Torch side of the GELU CUDA kernels: checks tensors, allocates the output, launches on the current stream.
// Two entry points to the same code: the Python module's forward/backward (the eager path calls them directly) and
// the CUDA kernels of the ops fuselab::gelu_cuda / fuselab::gelu_cuda_backward, whose schemas, fakes and autograd
// Python defines (fuselab.ops.library); registering them here lets the dispatcher reach C++ without Python.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/extension.h>
#include <torch/library.h>

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
  TORCH_CHECK(t.is_contiguous(), "gelu cuda: ", name, " must be contiguous");
}

void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, "gelu cuda: ", what, " kernel launch failed: ", cudaGetErrorString(err));
}

Form form_of(bool tanh) { return tanh ? Form::kTanh : Form::kErf; }

}  // namespace

// y = gelu(x); x: contiguous CUDA tensor of any shape (float32/float16/bfloat16); y: same shape and dtype.
at::Tensor forward_tensor(const at::Tensor& x, bool tanh) {
  check_input(x, "x");
  const DType dtype = dtype_of(x);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty_like(x);
  check_launch(fuselab::gelu::gelu_forward(x.data_ptr(), y.data_ptr(), x.numel(), dtype, form_of(tanh),
                                           c10::cuda::getCurrentCUDAStream()),
               "forward");
  return y;
}

// dx = dy * gelu'(x); dy, x: contiguous CUDA tensors of the same shape, dtype and device.
at::Tensor backward_tensor(const at::Tensor& dy, const at::Tensor& x, bool tanh) {
  check_input(dy, "dy");
  check_input(x, "x");
  TORCH_CHECK(dy.sizes() == x.sizes() && dy.scalar_type() == x.scalar_type() && dy.device() == x.device(),
              "gelu cuda: dy and x must have the same shape, dtype and device");
  const DType dtype = dtype_of(x);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor dx = at::empty_like(x);
  check_launch(fuselab::gelu::gelu_backward(dy.data_ptr(), x.data_ptr(), dx.data_ptr(), x.numel(), dtype,
                                            form_of(tanh), c10::cuda::getCurrentCUDAStream()),
               "backward");
  return dx;
}

namespace {

bool is_tanh(c10::string_view approximate) {
  TORCH_CHECK(approximate == "tanh" || approximate == "none", "gelu cuda: approximate='", approximate,
              "' is not a GELU form; accepted: 'tanh', 'none' (erf)");
  return approximate == "tanh";
}

// fuselab::gelu_cuda(Tensor x, str approximate) -> Tensor: any layout (non-contiguous x is copied first).
at::Tensor gelu_op(const at::Tensor& x, c10::string_view approximate) {
  return forward_tensor(x.contiguous(), is_tanh(approximate));
}

// fuselab::gelu_cuda_backward(Tensor dy, Tensor x, str approximate) -> Tensor
at::Tensor gelu_backward_op(const at::Tensor& dy, const at::Tensor& x, c10::string_view approximate) {
  return backward_tensor(dy.contiguous(), x.contiguous(), is_tanh(approximate));
}

// The eager autograd of the op, in C++: the backward runs on autograd's device thread without taking Python's lock
// (a Python autograd.Function costs some 40 us more a forward + backward on the H200's host). x: any layout.
class GeluFunction : public torch::autograd::Function<GeluFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, bool tanh) {
    ctx->save_for_backward({x});
    ctx->saved_data["tanh"] = tanh;
    return forward_tensor(x.contiguous(), tanh);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const bool tanh = ctx->saved_data["tanh"].toBool();
    return {backward_tensor(grads[0].contiguous(), x.contiguous(), tanh), at::Tensor()};
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

// The op's eager call, whole (fuselab.ops.library's `fast` entry): gelu_cuda(x, approximate) for a contiguous x
// that its Python check accepts and approximate "none" or "tanh" given; with autograd's graph where x needs one.
at::Tensor fast_gelu(PyObject* args, PyObject* kwargs) {
  namespace fc = fuselab::fast_call;
  PyObject* values[2];
  if (!fc::bind(args, kwargs, {"x", "approximate"}, values)) return {};
  const at::Tensor* x = fc::cuda_float(values[0]);
  const int form = fc::choice(values[1], {"none", "tanh"});
  if (x == nullptr || form < 0 || !x->is_contiguous()) return {};
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
