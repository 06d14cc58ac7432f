// Torch binding of the CUDA softmax: checks the tensors, then calls the launchers of softmax.cu on the current stream
// (c10::cuda::getCurrentCUDAStream, the same stream as at::cuda::getCurrentCUDAStream, from a lighter header).
// Two entry points: the Python module's forward/backward on (rows, width) views (the eager path), and the CUDA
// kernels of the ops fuselab::softmax_cuda / fuselab::softmax_cuda_backward, whose schemas, fakes and autograd
// Python defines (fuselab.ops.library); registered here, the dispatcher reaches them without Python.
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <map>
#include <mutex>
#include <tuple>

#include "../_cuda/fast_call.h"
#include "../_cuda/text.h"
#include "softmax.h"

namespace {

fuselab::SoftmaxDType dtype_of(const torch::Tensor& t) {
  const auto type = t.scalar_type();
  TORCH_CHECK(type == torch::kFloat32 || type == torch::kFloat16 || type == torch::kBFloat16, "softmax cuda: dtype ",
              type, " is not supported; accepted: float32, float16, bfloat16");
  return type == torch::kFloat32   ? fuselab::SoftmaxDType::f32
         : type == torch::kFloat16 ? fuselab::SoftmaxDType::f16
                                   : fuselab::SoftmaxDType::bf16;
}

// A (rows, width) CUDA matrix with unit column stride, on the device and with the dtype of `like`.
void check_rows(const torch::Tensor& t, const char* name, const torch::Tensor& like) {
  TORCH_CHECK(t.is_cuda(), "softmax cuda: ", name, " must be a CUDA tensor, got one on ", t.device().str());
  TORCH_CHECK(t.dim() == 2, "softmax cuda: ", name, " must be 2-d (rows, width), got shape ",
              fuselab::text::shape(t.sizes()));
  TORCH_CHECK(t.size(1) <= 1 || t.stride(1) == 1, "softmax cuda: ", name, " needs unit stride along the width");
  TORCH_CHECK(t.device() == like.device(), "softmax cuda: ", name, " is on ", t.device().str(), ", not ",
              like.device().str());
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), "softmax cuda: ", name, " has dtype ", t.scalar_type(),
              ", not ", like.scalar_type());
  TORCH_CHECK(t.sizes() == like.sizes(), "softmax cuda: ", name, " has shape ", fuselab::text::shape(t.sizes()),
              ", not ", fuselab::text::shape(like.sizes()));
}

void check_launch(cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, "softmax cuda: kernel launch failed: ", cudaGetErrorString(err));
}

// Per device: its SM count (read once) and the span rules Python set for it (`configure`: plan-table data).
struct DevicePlan {
  int sms = 0;
  fuselab::SoftmaxRules rules{};
  bool configured = false;
};

std::mutex plans_mutex;

std::map<int, DevicePlan>& device_plans() {
  static auto* plans = new std::map<int, DevicePlan>();  // never freed: kept to the process's end
  return *plans;
}

DevicePlan plan_of(const torch::Device& device) {
  const std::lock_guard<std::mutex> lock(plans_mutex);
  DevicePlan& plan = device_plans()[device.index()];
  TORCH_CHECK(plan.configured, "softmax cuda: no span rules for cuda:", fuselab::text::number(device.index()),
              " (fuselab.ops.softmax.cuda.extension() sets them when it loads the extension)");
  if (plan.sms == 0) check_launch(cudaDeviceGetAttribute(&plan.sms, cudaDevAttrMultiProcessorCount, device.index()));
  return plan;
}

// The span rules from Python's mapping of the plan table's names (every one given, no other); false where one is
// missing or unknown.
bool rules_from(const std::map<std::string, int64_t>& given, fuselab::SoftmaxRules& r) {
  size_t found = 0;
  const auto take = [&](const char* name, auto& field) {
    const auto it = given.find(name);
    if (it == given.end()) return false;
    field = static_cast<std::remove_reference_t<decltype(field)>>(it->second);
    ++found;
    return true;
  };
  const bool all = take("threads", r.threads) && take("hold", r.hold) && take("backward_hold", r.backward_hold) &&
                   take("min_span_bytes", r.min_span_bytes) && take("split_row_bytes", r.split_row_bytes) &&
                   take("blocks_per_sm", r.blocks_per_sm) &&
                   take("scalar_warp_width_fp32", r.scalar_warp_width_fp32) &&
                   take("scalar_warp_width_16bit", r.scalar_warp_width_16bit) &&
                   take("staged_row_bytes_fp32", r.staged_row_bytes_fp32) &&
                   take("staged_row_bytes_16bit", r.staged_row_bytes_16bit) &&
                   take("staged_packed_row_bytes", r.staged_packed_row_bytes) &&
                   take("staged_tile_bytes", r.staged_tile_bytes) &&
                   take("staged_blocks_per_sm", r.staged_blocks_per_sm) &&
                   take("edge_warp_row_bytes", r.edge_warp_row_bytes) &&
                   take("single_column_elementwise", r.single_column_elementwise) && take("one_wave", r.one_wave) &&
                   take("staged_lane_columns", r.staged_lane_columns);
  return all && found == given.size();
}

// Sets the span rules of CUDA device `device` (softmax_plan.h's SpanRules, by name); false, and nothing set, for
// names missing or unknown and values the kernels are not compiled for. Python checks them first and says why
// (cuda.refusal, on machines without a GPU too).
bool configure(int64_t device, const std::map<std::string, int64_t>& given) {
  const auto small = [](int64_t v) { return v >= 1 && v <= (1 << 20); };
  fuselab::SoftmaxRules rules{};
  if (!(device >= 0 && rules_from(given, rules) && small(given.at("threads")) && small(given.at("hold")) &&
        small(given.at("backward_hold")) && fuselab::softmax_plan::valid_rules(rules))) {
    return false;
  }
  const std::lock_guard<std::mutex> lock(plans_mutex);
  DevicePlan& plan = device_plans()[(int)device];
  plan.rules = rules;
  plan.configured = true;
  return true;
}

// A buffer of `numel` elements for the launchers on `stream`, kept from call to call per device, stream and name and
// grown anew when too small; `zeros`: made of zeros (counters, which the launchers leave zeros), else of any value
// (partials, written before they are read). While the stream is captured into a CUDA graph, a fresh buffer (the
// graph's own), zeros only where `zeros` asks for them: each fill is a node every replay runs. `hold` keeps the buffer
// alive for the call.
template <typename T>
T* kept_buffer(const char* name, const torch::Device& device, cudaStream_t stream, int64_t numel, bool zeros,
               torch::Tensor& hold) {
  if (numel == 0) return nullptr;
  const auto options = torch::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value).device(device);
  const auto fresh = [&](int64_t n) { return zeros ? torch::zeros({n}, options) : torch::empty({n}, options); };
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check_launch(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    hold = fresh(numel);
    return hold.data_ptr<T>();
  }
  using Key = std::tuple<const char*, int, cudaStream_t>;
  static std::mutex mutex;
  static auto* buffers = new std::map<Key, torch::Tensor>();  // never freed: kept to the process's end
  const std::lock_guard<std::mutex> lock(mutex);
  torch::Tensor& buffer = (*buffers)[Key{name, device.index(), stream}];
  if (!buffer.defined() || buffer.numel() < numel) {
    buffer = fresh(std::max<int64_t>(numel, buffer.defined() ? 2 * buffer.numel() : 0));
  }
  hold = buffer;
  return hold.data_ptr<T>();
}

// The launchers' scratch (softmax.h) for `size` on `stream`: counters (zeros) and partials (any value) kept apart, so
// the counters are zeros whatever the partials held.
fuselab::SoftmaxScratch scratch_for(const torch::Device& device, cudaStream_t stream,
                                    fuselab::SoftmaxScratchSize size, torch::Tensor& hold_counters,
                                    torch::Tensor& hold_partials) {
  return {kept_buffer<int>("counters", device, stream, size.counters, true, hold_counters),
          kept_buffer<float>("partials", device, stream, size.partials, false, hold_partials)};
}

// y = softmax(x) over the width; x, y: (rows, width).
void forward(const torch::Tensor& x, const torch::Tensor& y) {
  check_rows(x, "x", x);
  check_rows(y, "y", x);
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const DevicePlan plan = plan_of(x.device());
  const auto dtype = dtype_of(x);
  torch::Tensor counters, partials;
  const auto size = fuselab::softmax_forward_scratch_size(x.data_ptr(), y.data_ptr(), x.size(0), x.size(1),
                                                         x.stride(0), y.stride(0), dtype, plan.sms, plan.rules);
  check_launch(fuselab::softmax_forward(x.data_ptr(), y.data_ptr(), x.size(0), x.size(1), x.stride(0), y.stride(0),
                                        dtype, plan.sms, plan.rules,
                                        scratch_for(x.device(), stream, size, counters, partials), stream));
}

// dx = y * (dy - sum(dy * y)) over the width; all (rows, width).
void backward(const torch::Tensor& y, const torch::Tensor& dy, const torch::Tensor& dx) {
  check_rows(y, "y", y);
  check_rows(dy, "dy", y);
  check_rows(dx, "dx", y);
  const c10::cuda::CUDAGuard guard(y.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const DevicePlan plan = plan_of(y.device());
  const auto dtype = dtype_of(y);
  torch::Tensor counters, partials;
  const auto size = fuselab::softmax_backward_scratch_size(y.data_ptr(), dy.data_ptr(), dx.data_ptr(), y.size(0),
                                                          y.size(1), y.stride(0), dy.stride(0), dx.stride(0), dtype,
                                                          plan.sms, plan.rules);
  check_launch(fuselab::softmax_backward(y.data_ptr(), dy.data_ptr(), dx.data_ptr(), y.size(0), y.size(1),
                                         y.stride(0), dy.stride(0), dx.stride(0), dtype, plan.sms, plan.rules,
                                         scratch_for(y.device(), stream, size, counters, partials), stream));
}

// x (..., width) as (rows, width) with unit column stride: a view where one exists, else a contiguous copy (as
// fuselab.ops.softmax._shared.as_rows). x has at least one element.
torch::Tensor as_rows(const torch::Tensor& x, int64_t width) {
  const torch::Tensor t = (width > 1 && x.stride(-1) != 1) ? x.contiguous() : x;
  return t.reshape({-1, width});
}

// fuselab::softmax_cuda(Tensor x) -> Tensor: softmax over the last dimension, contiguous output.
torch::Tensor softmax_op(const torch::Tensor& x) {
  torch::Tensor y = torch::empty(x.sizes(), x.options());
  if (x.numel() == 0) return y;
  const int64_t width = x.dim() ? x.size(-1) : 1;
  forward(as_rows(x, width), y.view({-1, width}));
  return y;
}

// fuselab::softmax_cuda_backward(Tensor y, Tensor dy) -> Tensor: dx = y * (dy - sum(dy * y)) over the last dimension.
torch::Tensor softmax_backward_op(const torch::Tensor& y, const torch::Tensor& dy) {
  TORCH_CHECK(dy.sizes() == y.sizes(), "softmax cuda backward: dy has shape ", fuselab::text::shape(dy.sizes()),
              ", not y's ", fuselab::text::shape(y.sizes()));
  torch::Tensor dx = torch::empty(y.sizes(), y.options());
  if (y.numel() == 0) return dx;
  const int64_t width = y.dim() ? y.size(-1) : 1;
  backward(as_rows(y, width), as_rows(dy, width), dx.view({-1, width}));
  return dx;
}

// The eager autograd of the op, in C++: the backward runs on autograd's device thread without taking Python's lock
// (a Python autograd.Function costs some 40 us more a forward + backward on the H200's host).
class SoftmaxFunction : public torch::autograd::Function<SoftmaxFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x) {
    torch::Tensor y = softmax_op(x);
    ctx->save_for_backward({y});
    return y;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    return {softmax_backward_op(ctx->get_saved_variables()[0], grads[0])};
  }
};

torch::Tensor softmax_with_grad(const torch::Tensor& x) { return SoftmaxFunction::apply(x); }

// The ops as the dispatcher sees them, for a kernel that calls them below autograd.
const c10::TypedOperatorHandle<torch::Tensor(const torch::Tensor&)>& softmax_cuda_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("fuselab::softmax_cuda", "")
                             .typed<torch::Tensor(const torch::Tensor&)>();
  return op;
}

const c10::TypedOperatorHandle<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>& softmax_cuda_backward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("fuselab::softmax_cuda_backward", "")
                             .typed<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>();
  return op;
}

// fuselab::softmax_cuda's autograd on CUDA tensors (its AutogradCUDA kernel): the op and its backward op called
// through the dispatcher below autograd, so torch.compile's tracing sees both as ops, and compiled code runs them
// without Python (the Autograd kernel that Python's register_autograd gives the op yields to this one on CUDA).
class SoftmaxOpFunction : public torch::autograd::Function<SoftmaxOpFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x) {
    torch::Tensor y;
    {
      const at::AutoDispatchBelowADInplaceOrView below;
      y = softmax_cuda_op().call(x);
    }
    ctx->save_for_backward({y});
    return y;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    return {softmax_cuda_backward_op().call(ctx->get_saved_variables()[0], grads[0])};
  }
};

torch::Tensor softmax_autograd(const torch::Tensor& x) { return SoftmaxOpFunction::apply(x); }

// The op's eager call, whole (fuselab.ops.library's `fast` entry): softmax_cuda(x) for an x that its Python check
// accepts, with autograd's graph where x needs one.
torch::Tensor fast_softmax(PyObject* args, PyObject* kwargs) {
  namespace fc = fuselab::fast_call;
  PyObject* x_obj;
  if (!fc::bind(args, kwargs, {"x"}, &x_obj)) return {};
  const torch::Tensor* x = fc::cuda_float(x_obj);
  if (x == nullptr) return {};
  return fc::needs_grad(*x) ? softmax_with_grad(*x) : softmax_op(*x);
}

}  // namespace

TORCH_LIBRARY_IMPL(fuselab, CUDA, m) {
  m.impl("softmax_cuda", &softmax_op);
  m.impl("softmax_cuda_backward", &softmax_backward_op);
}

TORCH_LIBRARY_IMPL(fuselab, AutogradCUDA, m) {
  m.impl("softmax_cuda", &softmax_autograd);
  m.impl("softmax_cuda_backward", torch::autograd::autogradNotImplementedFallback());  // no second derivative
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("configure", &configure,
        "set the span rules of a CUDA device (softmax_plan.h's SpanRules, a dict by name); false: refused",
        pybind11::arg("device"), pybind11::arg("rules"));
  m.def("forward", &forward, "y = softmax(x) over the rows of x (rows, width)", pybind11::arg("x"), pybind11::arg("y"));
  m.def("backward", &backward, "dx = y * (dy - sum(dy * y)) row by row", pybind11::arg("y"), pybind11::arg("dy"),
        pybind11::arg("dx"));
  // The ops' kernels, whole: any shape in, contiguous out (one call from Python, rows and output made here).
  m.def("softmax", &softmax_op, "y = softmax(x) over the last dimension", pybind11::arg("x"));
  m.def("softmax_backward", &softmax_backward_op, "dx from y and dy over the last dimension", pybind11::arg("y"),
        pybind11::arg("dy"));
  m.def("softmax_with_grad", &softmax_with_grad, "softmax(x) with its backward attached in C++",
        pybind11::arg("x"));
  m.add_object("fast", pybind11::reinterpret_steal<pybind11::object>(fuselab::fast_call::function<fast_softmax>(
                           "fast", "fast(args, kwargs) -> y, or None: softmax_cuda's eager call, whole")));
}
