// The replays of a fused Triton op, in C++ against torch (built by fuselab.ops.launcher.replays_module).
//
// A `Replays` stands for one op (define_op(..., replay=True)). Its C entry `call(args, kwargs)` takes a user's eager
// call as made: it keys the call from its at::Tensors (dtype, 16-byte alignment, device, shape, strides) and its
// options (None, bool, int, float, str; by keyword: name and value), finds the launcher's Recipe recorded for that
// key (by Python, on the key's first call: fuselab.ops.launcher.recipe) and runs it through the launcher's C API
// (launcher_api.h): the outputs allocated (contiguous, as the key's first call returned them), the launches patched to
// this call's addresses, on the current stream. Where the one tensor input needs grad, the recipe runs inside a
// torch::autograd::Function whose backward finds the backward's Recipe (keyed by the forward's key and the
// gradient's layout) and runs it the same way, on autograd's device thread without Python's lock. So after a key's
// first call neither forward nor backward runs Python. What it holds nothing for is handed back: `call` returns the
// key (the Python path records under it), the backward calls the op's Python backward with the key (which records
// a recipe and `add_backward`s it).
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "launcher_api.h"

namespace py = pybind11;

namespace {

constexpr Py_ssize_t kMaxArgs = 64;
constexpr int kMaxOutputs = FUSELAB_RECIPE_MAX_OUTPUTS;  // a recipe's
constexpr size_t kMaxKeys = 4096;  // a bound on each table (cleared when full), not an LRU
constexpr const char* kCapsule = "fuselab_replay.Replays";

// A recipe held for a key: the launcher's Recipe object (a reference owned; nullptr for a refused key) and the index
// of its call's options among Replays' option sets. The last holder may be a backward on autograd's thread, so the
// reference is dropped with Python's lock taken.
struct Held {
  PyObject* recipe = nullptr;
  int options = 0;
  Held(PyObject* r, int o) : recipe(r), options(o) { Py_XINCREF(recipe); }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;
  ~Held() {
    if (recipe != nullptr && Py_IsInitialized()) {
      PyGILState_STATE state = PyGILState_Ensure();
      Py_DECREF(recipe);
      PyGILState_Release(state);
    }
  }
};
using HeldPtr = std::shared_ptr<const Held>;

void put_bytes(std::string& k, const void* p, size_t n) { k.append(static_cast<const char*>(p), n); }

template <typename T>
void put_value(std::string& k, T v) {
  put_bytes(k, &v, sizeof v);
}

// An option (None, bool, int, float, str) into k: 1; 0 when it makes no key (an int past 64 bits); 2 when `a` is not
// an option; -1 with a Python error.
int put_option(std::string& k, PyObject* a) {
  if (a == Py_None) {
    k += 'n';
    return 1;
  }
  if (PyBool_Check(a)) {
    k += a == Py_True ? 't' : 'f';
    return 1;
  }
  if (PyLong_Check(a)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(a, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow != 0) return 0;
    k += 'i';
    put_value(k, v);
    return 1;
  }
  if (PyFloat_Check(a)) {
    k += 'd';
    put_value(k, PyFloat_AS_DOUBLE(a));
    return 1;
  }
  if (PyUnicode_Check(a)) {
    Py_ssize_t len = 0;
    const char* text = PyUnicode_AsUTF8AndSize(a, &len);
    if (text == nullptr) return -1;
    k += 's';
    put_value(k, len);
    put_bytes(k, text, static_cast<size_t>(len));
    return 1;
  }
  return 2;
}

// A CUDA tensor's layout into k: dtype, address mod 16, device, rank, sizes, strides.
void put_tensor(std::string& k, const at::Tensor& t) {
  k += 'T';
  k += static_cast<char>(t.scalar_type());
  k += static_cast<char>(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16);
  k += static_cast<char>(t.get_device());
  const int64_t dim = t.dim();
  put_value(k, dim);
  put_bytes(k, t.sizes().data(), static_cast<size_t>(dim) * sizeof(int64_t));
  put_bytes(k, t.strides().data(), static_cast<size_t>(dim) * sizeof(int64_t));
}

uint64_t address(const at::Tensor& t) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(t.data_ptr())); }

// A call read: its key, and per argument its tensor (nullptr for an option) and address.
struct Call {
  std::string key;
  const at::Tensor* tensors[kMaxArgs];
  uint64_t ptrs[kMaxArgs];
  Py_ssize_t n = 0;
  int n_tensors = 0;
  int last_tensor = -1;
  bool requires_grad = false;
};

// The positional arguments into c: 1; 0 when one makes no key (a tensor not plainly torch.Tensor or not on a CUDA
// device, another kind of value), -1 with a Python error.
int read_args(PyObject* const* args, Py_ssize_t n, Call& c) {
  if (n > kMaxArgs) return 0;
  c.key.reserve(64 + 40 * static_cast<size_t>(n));
  c.n = n;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* a = args[i];
    c.tensors[i] = nullptr;
    c.ptrs[i] = 0;
    if (THPVariable_CheckExact(a)) {
      const at::Tensor& t = THPVariable_Unpack(a);
      if (!t.defined() || !t.is_cuda() || t.layout() != c10::kStrided) return 0;
      put_tensor(c.key, t);
      c.tensors[i] = &t;
      c.ptrs[i] = address(t);
      c.requires_grad = c.requires_grad || t.requires_grad();
      ++c.n_tensors;
      c.last_tensor = static_cast<int>(i);
      continue;
    }
    const int ok = put_option(c.key, a);
    if (ok != 1) return ok == 2 ? 0 : ok;
  }
  return 1;
}

// Options given by keyword into k (name, then value): 1, 0 (a value that is not an option), -1.
int read_keywords(PyObject* kwargs, std::string& k) {
  Py_ssize_t pos = 0;
  PyObject* name = nullptr;
  PyObject* value = nullptr;
  while (PyDict_Next(kwargs, &pos, &name, &value)) {
    Py_ssize_t len = 0;
    const char* text = PyUnicode_AsUTF8AndSize(name, &len);
    if (text == nullptr) return -1;
    k += 'k';
    put_value(k, len);
    put_bytes(k, text, static_cast<size_t>(len));
    const int ok = put_option(k, value);
    if (ok != 1) return ok == 2 ? 0 : ok;
  }
  return 1;
}

class Replays;

// What the autograd Function's forward is given besides its input.
struct Forward {
  Replays* replays;
  const Held* held;
  const Call* call;
  void* stream;
};

// One output, or several as a tuple.
PyObject* wrap(std::vector<at::Tensor> outs) {
  if (outs.size() == 1) return THPVariable_Wrap(std::move(outs[0]));
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(outs.size()));
  if (tuple == nullptr) return nullptr;
  for (size_t j = 0; j < outs.size(); ++j) {
    PyObject* t = THPVariable_Wrap(std::move(outs[j]));
    if (t == nullptr) {
      Py_DECREF(tuple);
      return nullptr;
    }
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(j), t);
  }
  return tuple;
}

struct ReplayFunction : torch::autograd::Function<ReplayFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const Forward& f);
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads);
};

class Replays {
 public:
  // api: the launcher's capsule; dtypes: the launcher's dtype numbers, in order (fuselab.ops.launcher.DTYPES);
  // tensor_index: forward's one tensor parameter (-1: several, no C++ autograd);
  // saved_from: what backward saves, in order, (true, i) forward's argument i or (false, i) its output i;
  // backward_sources: backward's parameters, (0, i) the gradient of output i, (1, i) saved value i, (2, i) forward's
  // option i; backward: the op's Python backward of a call the C++ autograd took, backward(key | None, options,
  // grad, saved), which records (key given) or just runs it; None: no C++ autograd.
  Replays(const py::capsule& api, std::vector<at::ScalarType> dtypes, int tensor_index,
          std::vector<std::pair<bool, int>> saved_from, std::vector<std::pair<int, int>> backward_sources,
          py::object backward)
      : dtypes_(std::move(dtypes)),
        tensor_index_(tensor_index),
        saved_from_(std::move(saved_from)),
        backward_sources_(std::move(backward_sources)),
        backward_(std::move(backward)) {
    if (std::strcmp(api.name(), "fuselab_launcher.api") != 0) throw py::type_error("Replays: not the launcher's api");
    api_ = static_cast<const FuselabLauncherApi*>(api.get_pointer());
    if (api_->version != FUSELAB_LAUNCHER_API_VERSION) throw py::value_error("Replays: the launcher's api version");
    differentiable_ = !backward_.is_none() && tensor_index_ >= 0 && backward_sources_.size() <= kMaxArgs;
    for (const auto& [from_argument, i] : saved_from_) {
      differentiable_ = differentiable_ && (from_argument ? i == tensor_index_ : i == 0);
    }
    for (const auto& [kind, i] : backward_sources_) {
      differentiable_ = differentiable_ && (kind != 0 || i == 0) &&
                        (kind != 1 || (i >= 0 && static_cast<size_t>(i) < saved_from_.size()));
    }
  }

  // The C entry: a user's call (positional arguments, options by keyword) -> its output; the key (bytes) where no
  // recipe is held for it (the Python path records one, then calls again); None where it leaves the call to Python
  // (replays off, this thread recording, an argument no key is made of, a refused key, another CUDA context or
  // stream, gradients needed by an op with several tensors).
  PyObject* call(PyObject* args, PyObject* kwargs) {
    if (!api_->replays_on() || api_->recording_depth() > 0) Py_RETURN_NONE;
    Call c;
    int ok = read_args(&PyTuple_GET_ITEM(args, 0), PyTuple_GET_SIZE(args), c);
    if (ok > 0 && PyDict_GET_SIZE(kwargs) > 0) ok = read_keywords(kwargs, c.key);
    if (ok < 0) return nullptr;
    if (ok == 0) Py_RETURN_NONE;
    // a call needing grad is taken only by the C++ autograd (one tensor input); others go to Python's
    const bool grad = c.requires_grad && at::GradMode::is_enabled();
    if (grad && !(differentiable_ && c.n_tensors == 1 && c.last_tensor == tensor_index_)) Py_RETURN_NONE;
    HeldPtr held = find(forward_, c.key);
    if (!held) return PyBytes_FromStringAndSize(c.key.data(), static_cast<Py_ssize_t>(c.key.size()));
    if (held->recipe == nullptr) Py_RETURN_NONE;  // refused: forward runs, every time
    void* stream = nullptr;
    if (!ready(*held, &stream) || (grad && api_->recipe_outputs(held->recipe) != 1)) Py_RETURN_NONE;
    if (grad) {
      const at::Tensor& x = *c.tensors[tensor_index_];
      return THPVariable_Wrap(ReplayFunction::apply(x, Forward{this, held.get(), &c, stream}));
    }
    return wrap(run(*held, c.ptrs, stream));
  }

  // replay(*args) (forward's arguments, completed) -> as `call`, never with autograd (the Python path's own).
  py::object replay(const py::args& args) {
    Call c;
    const int ok = read_args(&PyTuple_GET_ITEM(args.ptr(), 0), PyTuple_GET_SIZE(args.ptr()), c);
    if (ok < 0) throw py::error_already_set();
    if (ok == 0) return py::none();
    HeldPtr held = find(forward_, c.key);
    if (!held) return py::bytes(c.key);
    if (held->recipe == nullptr) return py::none();
    void* stream = nullptr;
    if (!ready(*held, &stream)) return py::none();
    PyObject* out = wrap(run(*held, c.ptrs, stream));
    if (out == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(out);
  }

  // key(*args) -> the key replay makes of forward's arguments, or None.
  py::object key(const py::args& args) {
    Call c;
    const int ok = read_args(&PyTuple_GET_ITEM(args.ptr(), 0), PyTuple_GET_SIZE(args.ptr()), c);
    if (ok < 0) throw py::error_already_set();
    return ok == 0 ? py::object(py::none()) : py::object(py::bytes(c.key));
  }

  // add(key, recipe): replay calls of `key` by `recipe` (a launcher Recipe); refuse(key): leave them to Python.
  void add(const py::bytes& key, const py::object& recipe) { put(forward_, key, recipe); }
  void refuse(const py::bytes& key) { put(forward_, key, py::none()); }
  // add_backward(key, recipe | None): the backward of the C++ autograd, replayed by `recipe` for `key`, or left to
  // Python (None).
  void add_backward(const py::bytes& key, const py::object& recipe) { put(backward_table_, key, recipe); }

  // size() -> forward recipes held (refused keys not counted); backward_size() -> the same for the backward.
  size_t size() { return count(forward_); }
  size_t backward_size() { return count(backward_table_); }

  // Run `held`'s recipe: its outputs allocated, the launches patched to ptrs (by argument) and to them.
  std::vector<at::Tensor> run(const Held& held, const uint64_t* ptrs, void* stream) {
    const int n = api_->recipe_outputs(held.recipe);
    const auto device = static_cast<c10::DeviceIndex>(api_->recipe_device(held.recipe));
    std::vector<at::Tensor> outs;
    outs.reserve(static_cast<size_t>(n));
    uint64_t out_ptrs[kMaxOutputs];
    for (int j = 0; j < n && j < kMaxOutputs; ++j) {
      int rank = 0;
      int dtype = 0;
      const int64_t* strides = nullptr;
      const int64_t* sizes = api_->recipe_output(held.recipe, j, &rank, &dtype, &strides);
      TORCH_CHECK(dtype >= 0 && static_cast<size_t>(dtype) < dtypes_.size(), "fuselab replays: an output's dtype");
      outs.push_back(at::empty_strided(
          at::IntArrayRef(sizes, static_cast<size_t>(rank)), at::IntArrayRef(strides, static_cast<size_t>(rank)),
          at::TensorOptions().dtype(dtypes_[static_cast<size_t>(dtype)]).device(at::kCUDA, device)));
      out_ptrs[j] = address(outs.back());
    }
    char error[256] = {0};
    const int rc = api_->run_recipe(held.recipe, ptrs, out_ptrs, stream, error, sizeof error);
    TORCH_CHECK(rc == 0, error);
    return outs;
  }

  // What backward needs, into ctx: this, the forward's key, its options' index, the saved tensors.
  void save(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& out, const Forward& f) {
    ctx->saved_data["replays"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(this));
    ctx->saved_data["key"] = f.call->key;
    ctx->saved_data["options"] = static_cast<int64_t>(f.held->options);
    std::vector<at::Tensor> saved;
    saved.reserve(saved_from_.size());
    for (const auto& entry : saved_from_) saved.push_back(entry.first ? x : out);
    ctx->save_for_backward(std::move(saved));
  }

  // The gradient of the input for `grad` (the output's): the backward's recipe for its key (the forward's key and
  // the gradient's layout) run, or the op's Python backward (recording a recipe where none is held).
  at::Tensor backward(torch::autograd::AutogradContext* ctx, const at::Tensor& grad) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const int options = static_cast<int>(ctx->saved_data["options"].toInt());
    std::string key = ctx->saved_data["key"].toStringRef();
    key += 'G';
    const bool keyed = grad.defined() && grad.is_cuda();
    if (keyed) put_tensor(key, grad);
    const size_t n = backward_sources_.size();
    const at::Tensor* tensors[kMaxArgs];
    uint64_t ptrs[kMaxArgs];
    for (size_t p = 0; p < n; ++p) {
      const auto [kind, i] = backward_sources_[p];
      tensors[p] = kind == 0 ? &grad : kind == 1 ? &saved[static_cast<size_t>(i)] : nullptr;
      ptrs[p] = tensors[p] != nullptr && tensors[p]->defined() ? address(*tensors[p]) : 0;
    }
    const bool replays = keyed && api_->replays_on();
    HeldPtr held = replays ? find(backward_table_, key) : nullptr;
    if (held && held->recipe != nullptr) {
      void* stream = nullptr;
      if (ready(*held, &stream) && api_->recipe_outputs(held->recipe) == 1) return run(*held, ptrs, stream)[0];
    }
    py::gil_scoped_acquire gil;
    py::object key_object = replays && !held ? py::object(py::bytes(key)) : py::object(py::none());
    py::tuple saved_tuple(saved.size());
    for (size_t i = 0; i < saved.size(); ++i) saved_tuple[i] = py::cast(saved[i]);
    py::object result = backward_(key_object, option_set(options), grad, saved_tuple);
    return result.cast<at::Tensor>();
  }

  // A PyCFunction calling `call` on this object (FusedOp's C entry).
  py::object entry() {
    static PyMethodDef def = {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&call_entry)),
                              METH_FASTCALL, "call(args, kwargs) -> the output, the key, or None"};
    py::capsule self(this, kCapsule);
    return py::reinterpret_steal<py::object>(PyCFunction_New(&def, self.ptr()));
  }

 private:
  static PyObject* call_entry(PyObject* self, PyObject* const* argv, Py_ssize_t nargs) {
    HANDLE_TH_ERRORS
    if (nargs != 2 || !PyTuple_Check(argv[0]) || !PyDict_Check(argv[1])) {
      PyErr_SetString(PyExc_TypeError, "call(args: tuple, kwargs: dict)");
      return nullptr;
    }
    auto* replays = static_cast<Replays*>(PyCapsule_GetPointer(self, kCapsule));
    if (replays == nullptr) return nullptr;
    return replays->call(argv[0], argv[1]);
    END_HANDLE_TH_ERRORS
  }

  using Table = std::unordered_map<std::string, HeldPtr>;

  HeldPtr find(const Table& table, const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = table.find(key);
    return it == table.end() ? nullptr : it->second;
  }

  void put(Table& table, const py::bytes& key, const py::object& recipe) {
    int options = 0;
    if (!recipe.is_none()) {
      if (!api_->is_recipe(recipe.ptr())) throw py::type_error("Replays: a recipe is a launcher Recipe, or None");
      options = intern(recipe.attr("options"));
    }
    auto held = std::make_shared<const Held>(recipe.is_none() ? nullptr : recipe.ptr(), options);
    std::string k = key;
    std::lock_guard<std::mutex> lock(mutex_);
    if (table.size() >= kMaxKeys) table.clear();
    table[std::move(k)] = std::move(held);
  }

  size_t count(const Table& table) {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t n = 0;
    for (const auto& entry : table) n += entry.second->recipe != nullptr;
    return n;
  }

  // The index of an options tuple among those seen (the same values, the same index); Python's lock held.
  int intern(const py::object& options) {
    std::string k;
    bool keyed = true;
    for (const py::handle& value : options) {
      const int ok = put_option(k, value.ptr());
      if (ok < 0) throw py::error_already_set();
      keyed = keyed && ok == 1;
    }
    if (keyed) {
      auto it = option_index_.find(k);
      if (it != option_index_.end()) return it->second;
    }
    const int index = static_cast<int>(option_sets_.size());
    option_sets_.push_back(options);
    if (keyed) option_index_.emplace(std::move(k), index);
    return index;
  }

  py::object option_set(int index) { return option_sets_.at(static_cast<size_t>(index)); }

  // Whether `held`'s recipe can run now: its context current, and if it holds workspaces, the current stream of its
  // device theirs and not capturing a CUDA graph (launcher.c's recipe_ready); that stream into *stream.
  bool ready(const Held& held, void** stream) {
    if (held.recipe == nullptr) return false;
    const auto device = static_cast<c10::DeviceIndex>(api_->recipe_device(held.recipe));
    *stream = c10::cuda::getCurrentCUDAStream(device).stream();
    return api_->recipe_ready(held.recipe, *stream) != 0;
  }

  const FuselabLauncherApi* api_ = nullptr;
  std::vector<at::ScalarType> dtypes_;
  int tensor_index_;
  std::vector<std::pair<bool, int>> saved_from_;
  std::vector<std::pair<int, int>> backward_sources_;
  py::object backward_;
  bool differentiable_ = false;
  std::mutex mutex_;  // the tables: the backward reads them on autograd's thread
  Table forward_, backward_table_;
  std::vector<py::object> option_sets_;
  std::unordered_map<std::string, int> option_index_;
};

at::Tensor ReplayFunction::forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const Forward& f) {
  at::Tensor out = std::move(f.replays->run(*f.held, f.call->ptrs, f.stream)[0]);
  f.replays->save(ctx, x, out, f);
  return out;
}

torch::autograd::variable_list ReplayFunction::backward(torch::autograd::AutogradContext* ctx,
                                                        torch::autograd::variable_list grads) {
  auto* replays = reinterpret_cast<Replays*>(static_cast<intptr_t>(ctx->saved_data["replays"].toInt()));
  return {replays->backward(ctx, grads[0]), at::Tensor()};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // Never deleted: a backward still pending may hold its address (an op's Replays lives as long as the process).
  py::class_<Replays, std::unique_ptr<Replays, py::nodelete>>(m, "Replays")
      .def(py::init<const py::capsule&, std::vector<at::ScalarType>, int, std::vector<std::pair<bool, int>>,
                    std::vector<std::pair<int, int>>, py::object>(),
           py::arg("api"), py::arg("dtypes"), py::arg("tensor_index"), py::arg("saved_from"), py::arg("backward_sources"),
           py::arg("backward"))
      .def_property_readonly("call", &Replays::entry, "the C entry: call(args, kwargs)")
      .def("replay", &Replays::replay)
      .def("key", &Replays::key)
      .def("add", &Replays::add)
      .def("refuse", &Replays::refuse)
      .def("add_backward", &Replays::add_backward)
      .def("size", &Replays::size)
      .def("backward_size", &Replays::backward_size);
}
