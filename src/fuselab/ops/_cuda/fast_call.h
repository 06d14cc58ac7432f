// The eager call of a fused CUDA impl, whole, in C++: what an extension gives fuselab.ops.library's FusedOp as its
// `fast` entry. FusedOp.__call__ hands it the call as the user made it, entry(args: tuple, kwargs: dict), before any
// Python of its own; the entry returns the output, or None to leave the call to the Python path (argument completion,
// the input check and its errors, copies of strided inputs). So an entry takes a call only where the impl's Python
// check would accept it, and answers None for anything else.
#pragma once

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>

#include <cstring>
#include <initializer_list>

namespace fuselab::fast_call {

// `obj` as a tensor the CUDA impls take: a plain torch.Tensor (not a subclass), defined, on a CUDA device, in
// float32, float16 or bfloat16 (their check's dtypes); nullptr for anything else.
inline const at::Tensor* cuda_float(PyObject* obj) {
  if (!THPVariable_CheckExact(obj)) return nullptr;
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (!t.defined() || !t.is_cuda()) return nullptr;
  const at::ScalarType s = t.scalar_type();
  return (s == at::kFloat || s == at::kHalf || s == at::kBFloat16) ? &t : nullptr;
}

// The call's arguments by parameter: values[i] is positional argument i, or the keyword argument names[i]. False
// when there are more positional arguments than names, a keyword that is not one of the names or repeats a
// positional one, or a parameter not given (defaults are the Python path's).
inline bool bind(PyObject* args, PyObject* kwargs, std::initializer_list<const char*> names, PyObject** values) {
  const Py_ssize_t n = PyTuple_GET_SIZE(args);
  const Py_ssize_t count = static_cast<Py_ssize_t>(names.size());
  if (n > count || n + PyDict_GET_SIZE(kwargs) != count) return false;
  Py_ssize_t i = 0;
  for (const char* name : names) {
    if (i < n) {
      values[i] = PyTuple_GET_ITEM(args, i);
    } else {
      values[i] = PyDict_GetItemString(kwargs, name);  // borrowed; nullptr when absent
      if (values[i] == nullptr) return false;
    }
    ++i;
  }
  return true;
}

// `obj` as UTF-8 text if it is a str equal to one of `choices`: the index of that choice; -1 otherwise.
inline int choice(PyObject* obj, std::initializer_list<const char*> choices) {
  if (!PyUnicode_Check(obj)) return -1;
  const char* text = PyUnicode_AsUTF8(obj);
  if (text == nullptr) {
    PyErr_Clear();
    return -1;
  }
  int i = 0;
  for (const char* c : choices) {
    if (std::strcmp(text, c) == 0) return i;
    ++i;
  }
  return -1;
}

// Whether the call builds autograd's graph: an input requiring grad while grad mode is on.
inline bool needs_grad(const at::Tensor& t) { return t.requires_grad() && at::GradMode::is_enabled(); }

// entry(args, kwargs) -> run(args, kwargs) as a Python function object `name` (for a pybind11 module's
// add_object): run returns the output tensor, or an undefined tensor for None; C++ errors become Python's.
template <at::Tensor (*run)(PyObject* args, PyObject* kwargs)>
PyObject* entry(PyObject* /*self*/, PyObject* const* argv, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 2 || !PyTuple_Check(argv[0]) || !PyDict_Check(argv[1])) {
    PyErr_SetString(PyExc_TypeError, "entry(args: tuple, kwargs: dict)");
    return nullptr;
  }
  at::Tensor out = run(argv[0], argv[1]);
  if (!out.defined()) Py_RETURN_NONE;
  return THPVariable_Wrap(std::move(out));
  END_HANDLE_TH_ERRORS
}

// A Python function object calling entry<run>, named `name` (kept alive by the module it is added to).
template <at::Tensor (*run)(PyObject* args, PyObject* kwargs)>
PyObject* function(const char* name, const char* doc) {
  static PyMethodDef def = {name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&entry<run>)),
                            METH_FASTCALL, doc};
  return PyCFunction_New(&def, nullptr);
}

}  // namespace fuselab::fast_call
