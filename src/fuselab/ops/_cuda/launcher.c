// fuselab's launcher of compiled Triton kernels: one C call from Python per launch, no Triton in between.
//
// A `Launcher` stands for one Triton kernel at one set of compile-time options (constexprs, num_warps, ...). Triton
// compiles one binary per *specialization* of the runtime arguments: each pointer's element type and 16-byte
// alignment, each integer's width (i32 / i64 / u64), whether it is 1 (then a constant) and whether it is a multiple
// of 16. `launch` reads that specialization from the arguments themselves (`key`, one byte per argument, finer than
// Triton's, so two calls with the same key can share a binary), finds the binary registered for it (`add`, from
// Python, after Triton compiled and ran the first call of that key) and launches it with cuLaunchKernel on the given
// stream. It returns the key, launching nothing, when no binary is registered for it (Python then launches through
// Triton and registers the binary, or `refuse`s the key), and None when an argument is of a kind it does not pass or
// the key was refused (Python stays with Triton for that call).
//
// Arguments: CUDA tensors (anything with is_cuda, data_ptr() and dtype; dtypes numbered by `dtypes` given at
// creation), Python ints, bools, floats and None. No torch headers: it builds with any C compiler against Python.h,
// and libcuda is opened at the first launch (dlopen), so the module loads and computes keys on machines without a
// GPU.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <structmember.h>

#include "launcher_api.h"

#define MAX_ARGS 64

typedef int CUresult;
typedef CUresult (*LaunchKernelFn)(void* function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                   unsigned bz, unsigned shared, void* stream, void** params, void** extra);
typedef CUresult (*GetErrorStringFn)(CUresult, const char**);
typedef CUresult (*CtxGetCurrentFn)(void** context);

static LaunchKernelFn cu_launch_kernel = NULL;
static GetErrorStringFn cu_get_error_string = NULL;
static CtxGetCurrentFn cu_ctx_get_current = NULL;
static PyObject* str_data_ptr = NULL;
static PyObject* str_dtype = NULL;
static PyObject* str_is_cuda = NULL;
static PyObject* str_get_device = NULL;
static PyObject* str_shape = NULL;
static PyObject* str_stride = NULL;
static PyObject* str_requires_grad = NULL;

// Whether Replayer.call may replay (`set_enabled`: fuselab.ops.launcher.enabled), and how deep this thread is in
// recordings (`recording`: a fused op called inside another's recorded forward runs its own Python, so that the outer
// recording sees its launches).
static int replays_on = 1;
static _Thread_local int recording_depth = 0;

// Argument kinds, in a binary's layout (one char per argument of the call): how its value is passed.
enum {
  PASS_SKIP = '-',   // a constant of the binary (an int equal to 1, None): not passed
  PASS_PTR = 'p',    // a device pointer (8 bytes)
  PASS_I32 = 'i',
  PASS_I64 = 'l',
  PASS_U64 = 'K',
  PASS_U8 = 'B',     // a bool (u1)
  PASS_F32 = 'f',
};

// Key bytes: one per argument.
enum {
  KEY_NONE = 1,
  KEY_FLOAT = 2,
  KEY_FALSE = 3,
  KEY_TRUE = 4,
  KEY_INT = 16,     // | width (0 i32, 1 i64, 2 u64) << 2 | (value == 1) << 1 | (value % 16 == 0)
  KEY_TENSOR = 64,  // | dtype number << 1 | (address % 16 == 0); dtype numbers < 32
};

static int load_driver(void) {
  if (cu_launch_kernel != NULL) return 0;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (lib == NULL) lib = dlopen("libcuda.so", RTLD_NOW | RTLD_GLOBAL);
  if (lib == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "fuselab launcher: cannot open libcuda.so.1 (no NVIDIA driver?)");
    return -1;
  }
  cu_get_error_string = (GetErrorStringFn)dlsym(lib, "cuGetErrorString");
  cu_ctx_get_current = (CtxGetCurrentFn)dlsym(lib, "cuCtxGetCurrent");
  cu_launch_kernel = (LaunchKernelFn)dlsym(lib, "cuLaunchKernel");
  if (cu_launch_kernel == NULL || cu_ctx_get_current == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "fuselab launcher: libcuda has no cuLaunchKernel or cuCtxGetCurrent");
    return -1;
  }
  return 0;
}

// What `table` (a dict: key -> entry, or None for a refused key) holds for `key` (a new reference, taken): 1 with
// *entry (borrowed) when it holds one; 0 with *answer what the caller returns (the key itself, given back, when it
// holds nothing; None for a refused key); -1 on an error.
static int look_up(PyObject* table, PyObject* key, PyObject** entry, PyObject** answer) {
  PyObject* found = PyDict_GetItemWithError(table, key);  // borrowed
  if (found == NULL) {
    if (PyErr_Occurred()) {
      Py_DECREF(key);
      return -1;
    }
    *answer = key;
    return 0;
  }
  Py_DECREF(key);
  if (found == Py_None) {
    *answer = Py_NewRef(Py_None);
    return 0;
  }
  *entry = found;
  return 1;
}

// Whether `a` says it is on a CUDA device (is_cuda is True); anything without is_cuda: no.
static int on_gpu(PyObject* a) {
  PyObject* flag = PyObject_GetAttr(a, str_is_cuda);
  if (flag == NULL) {
    PyErr_Clear();
    return 0;
  }
  Py_DECREF(flag);
  return flag == Py_True;
}

// ------------------------------------------------------------------------------------------------ a binary

typedef struct {
  PyObject_HEAD
  void* function;        // CUfunction, loaded by Triton in the device's primary context
  unsigned block;        // threads per program (32 * num_warps)
  unsigned shared;       // dynamic shared memory, bytes
  Py_ssize_t n_args;     // arguments of the call
  char layout[MAX_ARGS]; // PASS_* per argument
} Binary;

static PyTypeObject BinaryType;

// ------------------------------------------------------------------------------------------------ the launcher

typedef struct {
  PyObject_HEAD
  PyObject* dtypes;    // dict: dtype object -> int < 32
  PyObject* binaries;  // dict: key (bytes: device index, then one byte per argument) -> Binary
} Launcher;

// The key of `args` on device `device` into buf (1 + n bytes); the argument values a binary passes into values.
// Returns 1, 0 when an argument is of a kind the launcher does not pass, -1 on a Python error.
static int read_args(Launcher* self, PyObject* const* args, Py_ssize_t n, int device, unsigned char* buf,
                     uint64_t* values) {
  buf[0] = (unsigned char)device;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* a = args[i];
    unsigned char k;
    values[i] = 0;
    if (a == Py_None) {
      k = KEY_NONE;
    } else if (PyBool_Check(a)) {
      k = a == Py_True ? KEY_TRUE : KEY_FALSE;
      values[i] = a == Py_True;
    } else if (PyLong_Check(a)) {
      int overflow = 0;
      long long v = PyLong_AsLongLongAndOverflow(a, &overflow);
      if (v == -1 && PyErr_Occurred()) return -1;
      int width;
      uint64_t bits;
      if (overflow == 0) {
        width = (v >= INT32_MIN && v <= INT32_MAX) ? 0 : 1;
        bits = (uint64_t)v;
      } else if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(a);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
          PyErr_Clear();
          return 0;  // past 64 bits
        }
        width = 2;
        bits = u;
      } else {
        return 0;  // below -2^63
      }
      k = KEY_INT | width << 2 | (bits == 1) << 1 | (bits % 16 == 0);
      values[i] = bits;
    } else if (PyFloat_Check(a)) {
      k = KEY_FLOAT;
      float f = (float)PyFloat_AS_DOUBLE(a);
      memcpy(&values[i], &f, sizeof f);
    } else {
      if (!on_gpu(a)) return 0;  // a CPU tensor goes to Triton, which refuses it
      PyObject* dtype = PyObject_GetAttr(a, str_dtype);
      if (dtype == NULL) {
        PyErr_Clear();
        return 0;
      }
      PyObject* code = PyDict_GetItemWithError(self->dtypes, dtype);  // borrowed
      Py_DECREF(dtype);
      if (code == NULL) {
        if (PyErr_Occurred()) PyErr_Clear();
        return 0;
      }
      PyObject* ptr = PyObject_CallMethodNoArgs(a, str_data_ptr);
      if (ptr == NULL) {
        PyErr_Clear();
        return 0;
      }
      unsigned long long address = PyLong_AsUnsignedLongLong(ptr);
      Py_DECREF(ptr);
      if (address == (unsigned long long)-1 && PyErr_Occurred()) return -1;
      k = KEY_TENSOR | (unsigned char)(PyLong_AsLong(code) << 1) | (address % 16 == 0);
      values[i] = address;
    }
    buf[1 + i] = k;
  }
  return 1;
}

static PyObject* make_key(Launcher* self, PyObject* const* args, Py_ssize_t n, int device, uint64_t* values) {
  unsigned char buf[MAX_ARGS + 1];
  if (n > MAX_ARGS) Py_RETURN_NONE;
  int ok = read_args(self, args, n, device, buf, values);
  if (ok < 0) return NULL;
  if (ok == 0) Py_RETURN_NONE;
  return PyBytes_FromStringAndSize((const char*)buf, n + 1);
}

// Launch binary `b` on `grid` with the argument values of `values` (one per argument, as read_args reads them) on
// `stream`, with no Python (the driver loaded): 0; -1 with a message in error (error_len bytes at most).
static int launch_raw(Binary* b, const unsigned long long grid[3], const uint64_t* values, void* stream, char* error,
                      size_t error_len) {
  if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return 0;  // nothing to run, as Triton
  if (grid[0] > 0x7fffffffULL || grid[1] > 65535 || grid[2] > 65535) {
    snprintf(error, error_len, "fuselab launcher: grid (%llu, %llu, %llu) is past the GPU's limits", grid[0], grid[1],
             grid[2]);
    return -1;
  }
  // Parameters in the binary's order: the passed arguments, then Triton's two scratch pointers (null: a binary that
  // needs scratch memory is never registered).
  int32_t i32[MAX_ARGS];
  uint8_t u8[MAX_ARGS];
  float f32[MAX_ARGS];
  uint64_t wide[MAX_ARGS];
  uint64_t scratch[2] = {0, 0};
  void* params[MAX_ARGS + 2];
  int p = 0;
  for (Py_ssize_t i = 0; i < b->n_args; i++) {
    switch (b->layout[i]) {
      case PASS_SKIP:
        break;
      case PASS_I32:
        i32[i] = (int32_t)values[i];
        params[p++] = &i32[i];
        break;
      case PASS_U8:
        u8[i] = (uint8_t)values[i];
        params[p++] = &u8[i];
        break;
      case PASS_F32:
        memcpy(&f32[i], &values[i], sizeof(float));
        params[p++] = &f32[i];
        break;
      default:  // pointers and 64-bit integers
        wide[i] = values[i];
        params[p++] = &wide[i];
        break;
    }
  }
  params[p++] = &scratch[0];
  params[p++] = &scratch[1];
  if (cu_launch_kernel == NULL) {
    snprintf(error, error_len, "fuselab launcher: the CUDA driver is not loaded");
    return -1;
  }
  CUresult err = cu_launch_kernel(b->function, (unsigned)grid[0], (unsigned)grid[1], (unsigned)grid[2], b->block, 1,
                                  1, b->shared, stream, params, NULL);
  if (err != 0) {
    const char* msg = NULL;
    if (cu_get_error_string != NULL) cu_get_error_string(err, &msg);
    snprintf(error, error_len, "fuselab launcher: cuLaunchKernel failed: %s (CUresult %d)", msg ? msg : "unknown error",
             err);
    return -1;
  }
  return 0;
}

// launch_raw, its failure a Python RuntimeError (a grid past the limits: ValueError): 0 or -1.
static int launch_binary(Binary* b, const unsigned long long grid[3], const uint64_t* values, void* stream) {
  char error[256];
  if (load_driver() < 0) return -1;
  if (launch_raw(b, grid, values, stream, error, sizeof error) == 0) return 0;
  int past = grid[0] > 0x7fffffffULL || grid[1] > 65535 || grid[2] > 65535;
  PyErr_SetString(past ? PyExc_ValueError : PyExc_RuntimeError, error);
  return -1;
}

// launch(grid, device, stream, *args) -> True (launched); the key (bytes) when nothing is registered for it (Python
// launches through Triton and registers the binary, or refuses the key); None when an argument, or the grid, is of a
// kind the launcher does not pass, or the key was refused (Python launches through Triton). grid: a tuple or list of
// 1 to 3 Python ints.
static PyObject* Launcher_launch(Launcher* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 3) {
    PyErr_SetString(PyExc_TypeError, "launch(grid, device, stream, *args)");
    return NULL;
  }
  unsigned long long grid[3] = {1, 1, 1};
  PyObject* g = args[0];
  if (!(PyTuple_CheckExact(g) || PyList_CheckExact(g))) Py_RETURN_NONE;  // a function of the meta-parameters
  Py_ssize_t dims = PySequence_Fast_GET_SIZE(g);
  if (dims < 1 || dims > 3) Py_RETURN_NONE;
  for (Py_ssize_t d = 0; d < dims; d++) {
    PyObject* v = PySequence_Fast_GET_ITEM(g, d);
    if (!PyLong_CheckExact(v)) Py_RETURN_NONE;
    grid[d] = PyLong_AsUnsignedLongLong(v);
    if (grid[d] == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  }
  long device = PyLong_AsLong(args[1]);
  if (device == -1 && PyErr_Occurred()) return NULL;
  void* stream = PyLong_AsVoidPtr(args[2]);
  if (stream == NULL && PyErr_Occurred()) return NULL;
  Py_ssize_t n = nargs - 3;
  uint64_t values[MAX_ARGS];
  PyObject* key = make_key(self, args + 3, n, (int)device, values);
  if (key == NULL || key == Py_None) return key;
  PyObject *found, *answer;
  int held = look_up(self->binaries, key, &found, &answer);  // refused: Triton launches it
  if (held <= 0) return held < 0 ? NULL : answer;
  if (launch_binary((Binary*)found, grid, values, stream) < 0) return NULL;
  Py_RETURN_TRUE;
}

// key(device, *args) -> bytes, or None (an argument the launcher does not pass).
static PyObject* Launcher_key(Launcher* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1) {
    PyErr_SetString(PyExc_TypeError, "key(device, *args)");
    return NULL;
  }
  long device = PyLong_AsLong(args[0]);
  if (device == -1 && PyErr_Occurred()) return NULL;
  uint64_t values[MAX_ARGS];
  return make_key(self, args + 1, nargs - 1, (int)device, values);
}

// binary(device, *args) -> the Binary registered for the key of `args`, or None.
static PyObject* Launcher_binary(Launcher* self, PyObject* const* args, Py_ssize_t nargs) {
  PyObject* key = Launcher_key(self, args, nargs);
  if (key == NULL || key == Py_None) return key;
  PyObject* found = PyDict_GetItemWithError(self->binaries, key);  // borrowed
  Py_DECREF(key);
  if (found == NULL) {
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
  }
  Py_INCREF(found);
  return found;  // None for a refused key
}

// values(device, *args) -> bytes: the 8-byte values launch passes for `args` (as read_args reads them), or None.
static PyObject* Launcher_values(Launcher* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1 || nargs - 1 > MAX_ARGS) {
    PyErr_SetString(PyExc_TypeError, "values(device, *args), at most 64 args");
    return NULL;
  }
  uint64_t values[MAX_ARGS];
  unsigned char buf[MAX_ARGS + 1];
  int ok = read_args(self, args + 1, nargs - 1, 0, buf, values);
  if (ok < 0) return NULL;
  if (ok == 0) Py_RETURN_NONE;
  return PyBytes_FromStringAndSize((const char*)values, (nargs - 1) * (Py_ssize_t)sizeof(uint64_t));
}

// add(key, function, num_warps, shared, layout): register a binary for `key` (from `key`).
static PyObject* Launcher_add(Launcher* self, PyObject* args) {
  PyObject* key;
  unsigned long long function;
  unsigned num_warps, shared;
  const char* layout;
  Py_ssize_t layout_len;
  if (!PyArg_ParseTuple(args, "SKIIs#", &key, &function, &num_warps, &shared, &layout, &layout_len)) return NULL;
  if (PyBytes_GET_SIZE(key) != layout_len + 1 || layout_len > MAX_ARGS) {
    PyErr_SetString(PyExc_ValueError, "fuselab launcher: the layout needs one char per argument of the key");
    return NULL;
  }
  for (Py_ssize_t i = 0; i < layout_len; i++) {
    if (layout[i] == '\0' || !strchr("-pilKBf", layout[i])) {  // strchr finds the string's own NUL too
      PyErr_Format(PyExc_ValueError, "fuselab launcher: unknown layout char %c", layout[i]);
      return NULL;
    }
  }
  Binary* b = PyObject_New(Binary, &BinaryType);
  if (b == NULL) return NULL;
  b->function = (void*)(uintptr_t)function;
  b->block = 32 * num_warps;
  b->shared = shared;
  b->n_args = layout_len;
  memcpy(b->layout, layout, layout_len);
  int rc = PyDict_SetItem(self->binaries, key, (PyObject*)b);
  Py_DECREF(b);
  if (rc < 0) return NULL;
  Py_RETURN_NONE;
}

// refuse(key): launch answers None for `key` from now on (Triton launches it: a binary the launcher cannot pass).
static PyObject* Launcher_refuse(Launcher* self, PyObject* key) {
  if (!PyBytes_Check(key)) {
    PyErr_SetString(PyExc_TypeError, "refuse(key): key is the bytes launch() returned");
    return NULL;
  }
  if (PyDict_SetItem(self->binaries, key, Py_None) < 0) return NULL;
  Py_RETURN_NONE;
}

// size() -> the number of binaries registered (refused keys not counted).
static PyObject* Launcher_size(Launcher* self, PyObject* Py_UNUSED(ignored)) {
  Py_ssize_t pos = 0, n = 0;
  PyObject *key, *value;
  while (PyDict_Next(self->binaries, &pos, &key, &value)) n += value != Py_None;
  return PyLong_FromSsize_t(n);
}

static int Launcher_init(Launcher* self, PyObject* args, PyObject* kwds) {
  PyObject* dtypes;
  static char* names[] = {"dtypes", NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!", names, &PyDict_Type, &dtypes)) return -1;
  Py_INCREF(dtypes);
  Py_XSETREF(self->dtypes, dtypes);
  Py_XSETREF(self->binaries, PyDict_New());
  return self->binaries == NULL ? -1 : 0;
}

static void Launcher_dealloc(Launcher* self) {
  Py_XDECREF(self->dtypes);
  Py_XDECREF(self->binaries);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static PyMethodDef Launcher_methods[] = {
    {"launch", (PyCFunction)(void (*)(void))Launcher_launch, METH_FASTCALL,
     "launch(grid, device, stream, *args) -> True, the key (bytes: nothing registered for it), None"},
    {"key", (PyCFunction)(void (*)(void))Launcher_key, METH_FASTCALL, "key(device, *args) -> bytes or None"},
    {"add", (PyCFunction)Launcher_add, METH_VARARGS, "add(key, function, num_warps, shared, layout)"},
    {"binary", (PyCFunction)(void (*)(void))Launcher_binary, METH_FASTCALL, "binary(device, *args) -> Binary or None"},
    {"values", (PyCFunction)(void (*)(void))Launcher_values, METH_FASTCALL, "values(device, *args) -> bytes or None"},
    {"refuse", (PyCFunction)Launcher_refuse, METH_O, "refuse(key): Triton launches `key` from now on"},
    {"size", (PyCFunction)Launcher_size, METH_NOARGS, "number of binaries registered"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LauncherType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fuselab_launcher.Launcher",
    .tp_basicsize = sizeof(Launcher),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Launcher_init,
    .tp_dealloc = (destructor)Launcher_dealloc,
    .tp_methods = Launcher_methods,
    .tp_doc = "Launches one Triton kernel's binaries, one per key of its arguments (see the module's source).",
};

static PyTypeObject BinaryType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fuselab_launcher.Binary",
    .tp_basicsize = sizeof(Binary),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One compiled binary of a Triton kernel.",
};

// ------------------------------------------------------------------------------------------------ replays
//
// A Replayer stands for one fused op's eager forward. Its key of a call reads each tensor's dtype, device, 16-byte
// alignment, shape and strides, and each option's value. A Recipe, recorded from the first call of a key (in
// Python: fuselab.ops.launcher.recipe), redoes such a call with no Python between: the output allocated like one of
// the inputs (torch.empty_like, contiguous), then each step's binary launched with the values it was launched with,
// its pointers patched to this call's inputs and output, on the current stream.

#define MAX_STEPS 8
#define KEY_MAX 2048

typedef struct {
  Binary* binary;  // a reference held
  unsigned long long grid[3];
  uint64_t values[MAX_ARGS];
  Py_ssize_t n_patches;
  int patch_arg[MAX_ARGS];
  int patch_source[MAX_ARGS];  // -1: the output; else the index of the call's argument whose address goes there
} Step;

typedef struct {
  PyObject_HEAD
  int device;
  void* context;  // the CUDA context the binaries were loaded in: replayed only while it is current
  void* stream;   // the stream its workspaces belong to, replayed only on it; NULL: any stream
  PyObject* keep; // what the launches' constant pointers point into (workspaces), kept alive
  PyObject* options;  // the call's options (its arguments that are not tensors, in order): a tuple
  int out_from;   // the output: torch.empty_like(argument out_from, memory_format=torch.contiguous_format)
  int n_steps;
  Step steps[MAX_STEPS];
} Recipe;

static PyTypeObject RecipeType;

// Recipe(device, out_from, steps, keep=(), stream=0, options=()): steps a sequence of (binary, (gx, gy, gz), values:
// bytes, ((arg, source), ...)); keep: objects held for the recipe's life (the workspaces its values point into);
// stream: the only stream it may run on (0: any); options: the recorded call's options (read by the C++ autograd,
// whose backward passes them on where Python runs it).
static int Recipe_init(Recipe* self, PyObject* args, PyObject* kwds) {
  int device, out_from;
  PyObject* steps;
  PyObject* keep = NULL;
  PyObject* options = NULL;
  unsigned long long stream = 0;
  if (!PyArg_ParseTuple(args, "iiO|OKO!", &device, &out_from, &steps, &keep, &stream, &PyTuple_Type, &options))
    return -1;
  if (options == NULL) options = PyTuple_New(0);
  else Py_INCREF(options);
  if (options == NULL) return -1;
  Py_XSETREF(self->options, options);
  Py_XINCREF(keep);
  Py_XSETREF(self->keep, keep);
  self->stream = (void*)(uintptr_t)stream;
  PyObject* seq = PySequence_Fast(steps, "steps must be a sequence");
  if (seq == NULL) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n > MAX_STEPS) {
    Py_DECREF(seq);
    PyErr_Format(PyExc_ValueError, "fuselab launcher: a recipe holds at most %d launches", MAX_STEPS);
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* binary;
    PyObject* values;
    PyObject* patches;
    Step* st = &self->steps[i];
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "O!(KKK)SO", &BinaryType, &binary, &st->grid[0],
                          &st->grid[1], &st->grid[2], &values, &patches)) {
      Py_DECREF(seq);
      return -1;
    }
    Binary* b = (Binary*)binary;
    if (PyBytes_GET_SIZE(values) != b->n_args * (Py_ssize_t)sizeof(uint64_t)) {
      Py_DECREF(seq);
      PyErr_SetString(PyExc_ValueError, "fuselab launcher: a step's values need 8 bytes per argument of its binary");
      return -1;
    }
    memcpy(st->values, PyBytes_AS_STRING(values), PyBytes_GET_SIZE(values));
    PyObject* pseq = PySequence_Fast(patches, "patches must be a sequence");
    if (pseq == NULL) {
      Py_DECREF(seq);
      return -1;
    }
    st->n_patches = PySequence_Fast_GET_SIZE(pseq);
    for (Py_ssize_t j = 0; j < st->n_patches && j < MAX_ARGS; j++) {
      if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(pseq, j), "ii", &st->patch_arg[j], &st->patch_source[j]) ||
          st->patch_arg[j] < 0 || st->patch_arg[j] >= b->n_args) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "fuselab launcher: a patch past the arguments");
        Py_DECREF(pseq);
        Py_DECREF(seq);
        return -1;
      }
    }
    Py_DECREF(pseq);
    Py_INCREF(binary);
    st->binary = b;
    self->n_steps = (int)i + 1;
  }
  Py_DECREF(seq);
  self->device = device;
  self->out_from = out_from;
  if (load_driver() < 0 || cu_ctx_get_current(&self->context) != 0) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "fuselab launcher: no current CUDA context");
    return -1;
  }
  return 0;
}

static void Recipe_dealloc(Recipe* self) {
  for (int i = 0; i < self->n_steps; i++) Py_XDECREF(self->steps[i].binary);
  Py_XDECREF(self->keep);
  Py_XDECREF(self->options);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static PyMemberDef Recipe_members[] = {
    {"options", T_OBJECT, offsetof(Recipe, options), READONLY, "the recorded call's options (a tuple)"},
    {NULL, 0, 0, 0, NULL},
};

// Whether `r` may run now on `stream`: its CUDA context current, and `stream` its workspaces' if it holds any.
static int recipe_ready(Recipe* r, void* stream) {
  void* context = NULL;
  if (cu_ctx_get_current == NULL || cu_ctx_get_current(&context) != 0 || context != r->context) return 0;
  return r->stream == NULL || stream == r->stream;
}

// Run `r`'s launches on `stream`, pointers patched to ptrs (by call argument) and out_ptr (the output), with no
// Python: 0; -1 with a message in error.
static int run_steps(Recipe* r, const uint64_t* ptrs, uint64_t out_ptr, void* stream, char* error, size_t error_len) {
  for (int i = 0; i < r->n_steps; i++) {
    Step* st = &r->steps[i];
    uint64_t values[MAX_ARGS];
    memcpy(values, st->values, st->binary->n_args * sizeof(uint64_t));
    for (Py_ssize_t j = 0; j < st->n_patches; j++) {
      int source = st->patch_source[j];
      values[st->patch_arg[j]] = source < 0 ? out_ptr : ptrs[source];
    }
    if (launch_raw(st->binary, st->grid, values, stream, error, error_len) < 0) return -1;
  }
  return 0;
}

typedef struct {
  PyObject_HEAD
  PyObject* dtypes;        // dict: dtype -> int
  PyObject* recipes;       // dict: key -> Recipe
  PyObject* empty_like;    // torch.empty_like
  PyObject* alloc_kwargs;  // {"memory_format": torch.contiguous_format}
  PyObject* raw_stream;    // torch._C._cuda_getCurrentRawStream
  PyObject* tensor_type;   // torch.Tensor: Replayer.call takes tensors of exactly this type
} Replayer;

typedef struct {
  unsigned char buf[KEY_MAX];
  Py_ssize_t len;
} KeyBuf;

static int put(KeyBuf* k, const void* p, Py_ssize_t n) {
  if (k->len + n > KEY_MAX) return 0;
  memcpy(k->buf + k->len, p, n);
  k->len += n;
  return 1;
}

static int put_ints(KeyBuf* k, PyObject* tuple) {  // a tuple of Python ints (torch.Size, a stride tuple)
  if (!PyTuple_Check(tuple)) return 0;
  Py_ssize_t n = PyTuple_GET_SIZE(tuple);
  if (!put(k, &n, sizeof n)) return 0;
  for (Py_ssize_t i = 0; i < n; i++) {
    long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, i));
    if (v == -1 && PyErr_Occurred()) return -1;
    if (!put(k, &v, sizeof v)) return 0;
  }
  return 1;
}

// An option's value (None, bool, int, float, str) into k: 1; 0 when it makes no key (an int past 64 bits, a full
// buffer); 2 when `a` is not an option; -1 on a Python error.
static int put_option(KeyBuf* k, PyObject* a) {
  if (a == Py_None) return put(k, "n", 1);
  if (PyBool_Check(a)) return put(k, a == Py_True ? "t" : "f", 1);
  if (PyLong_Check(a)) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(a, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    return !overflow && put(k, "i", 1) && put(k, &v, sizeof v);
  }
  if (PyFloat_Check(a)) {
    double v = PyFloat_AS_DOUBLE(a);
    return put(k, "d", 1) && put(k, &v, sizeof v);
  }
  if (PyUnicode_Check(a)) {
    Py_ssize_t len;
    const char* text = PyUnicode_AsUTF8AndSize(a, &len);
    if (text == NULL) return -1;
    return put(k, "s", 1) && put(k, &len, sizeof len) && put(k, text, len);
  }
  return 2;
}

// A CUDA tensor into k (dtype, 16-byte alignment, device, shape, strides), its address into *ptr: 1, 0 (not a CUDA
// tensor of a numbered dtype, a full buffer), -1.
static int put_tensor(Replayer* self, KeyBuf* k, PyObject* a, uint64_t* ptr) {
  if (!on_gpu(a)) return 0;
  PyObject* dtype = PyObject_GetAttr(a, str_dtype);
  if (dtype == NULL) return -1;
  PyObject* code = PyDict_GetItemWithError(self->dtypes, dtype);  // borrowed
  Py_DECREF(dtype);
  if (code == NULL) return PyErr_Occurred() ? -1 : 0;
  PyObject* address = PyObject_CallMethodNoArgs(a, str_data_ptr);
  if (address == NULL) return -1;
  *ptr = PyLong_AsUnsignedLongLong(address);
  Py_DECREF(address);
  if (*ptr == (uint64_t)-1 && PyErr_Occurred()) return -1;
  PyObject* device = PyObject_CallMethodNoArgs(a, str_get_device);
  if (device == NULL) return -1;
  long dev = PyLong_AsLong(device);
  Py_DECREF(device);
  unsigned char head[3] = {'T', (unsigned char)PyLong_AsLong(code), (unsigned char)(*ptr % 16)};
  int ok = put(k, head, 3) && put(k, &dev, sizeof dev);
  if (ok) {
    PyObject* shape = PyObject_GetAttr(a, str_shape);
    if (shape == NULL) return -1;
    ok = put_ints(k, shape);
    Py_DECREF(shape);
  }
  if (ok > 0) {
    PyObject* strides = PyObject_CallMethodNoArgs(a, str_stride);
    if (strides == NULL) return -1;
    ok = put_ints(k, strides);
    Py_DECREF(strides);
  }
  return ok;
}

// The key of a call with positional `args` into k; each tensor's address into ptrs. With `plain`, as a user's call
// (Replayer.call): a tensor must be exactly torch.Tensor and not require grad. 1, 0 (an argument no key is made of),
// -1.
static int call_key(Replayer* self, PyObject* const* args, Py_ssize_t n, KeyBuf* k, uint64_t* ptrs, int plain) {
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* a = args[i];
    int ok = put_option(k, a);
    if (ok == 2) {
      if (plain) {
        if (Py_TYPE(a) != (PyTypeObject*)self->tensor_type) return 0;
        PyObject* grad = PyObject_GetAttr(a, str_requires_grad);
        if (grad == NULL) return -1;
        Py_DECREF(grad);
        if (grad != Py_False) return 0;
      }
      ok = put_tensor(self, k, a, &ptrs[i]);
    }
    if (ok <= 0) return ok;
  }
  return 1;
}

// Options given by keyword (a dict of name -> None, bool, int, float or str) into k: 1, 0 (another value), -1.
static int keyword_key(PyObject* kwargs, KeyBuf* k) {
  Py_ssize_t pos = 0;
  PyObject *name, *value;
  while (PyDict_Next(kwargs, &pos, &name, &value)) {
    Py_ssize_t len;
    const char* text = PyUnicode_AsUTF8AndSize(name, &len);
    if (text == NULL) return -1;
    int ok = put(k, "k", 1) && put(k, &len, sizeof len) && put(k, text, len);
    if (ok) ok = put_option(k, value);
    if (ok != 1) return ok == 2 ? 0 : ok;
  }
  return 1;
}

static PyObject* replay_key(Replayer* self, PyObject* const* args, Py_ssize_t n, uint64_t* ptrs) {
  KeyBuf k;
  k.len = 0;
  if (n > MAX_ARGS) Py_RETURN_NONE;
  int ok = call_key(self, args, n, &k, ptrs, 0);
  if (ok < 0) return NULL;
  if (ok == 0) Py_RETURN_NONE;
  return PyBytes_FromStringAndSize((const char*)k.buf, k.len);
}

// key(*args) -> bytes, or None (an argument no key is made of: the call is not replayed).
static PyObject* Replayer_key(Replayer* self, PyObject* const* args, Py_ssize_t nargs) {
  uint64_t ptrs[MAX_ARGS];
  return replay_key(self, args, nargs, ptrs);
}

// Recipe `r` run for a call with positional `args` (ptrs: their tensors' addresses): its output; None when the
// recipe's CUDA context is not current, or its stream not the current one; NULL on an error.
static PyObject* run_recipe(Replayer* self, Recipe* r, PyObject* const* args, const uint64_t* ptrs) {
  if (load_driver() < 0) return NULL;
  PyObject* device = PyLong_FromLong(r->device);
  if (device == NULL) return NULL;
  PyObject* stream_obj = PyObject_CallOneArg(self->raw_stream, device);
  Py_DECREF(device);
  if (stream_obj == NULL) return NULL;
  void* stream = PyLong_AsVoidPtr(stream_obj);
  Py_DECREF(stream_obj);
  if (stream == NULL && PyErr_Occurred()) return NULL;
  if (!recipe_ready(r, stream)) Py_RETURN_NONE;  // another context, or its workspaces are another stream's
  PyObject* like = PyTuple_Pack(1, args[r->out_from]);
  if (like == NULL) return NULL;
  PyObject* out = PyObject_Call(self->empty_like, like, self->alloc_kwargs);
  Py_DECREF(like);
  if (out == NULL) return NULL;
  PyObject* out_ptr_obj = PyObject_CallMethodNoArgs(out, str_data_ptr);
  if (out_ptr_obj == NULL) {
    Py_DECREF(out);
    return NULL;
  }
  uint64_t out_ptr = PyLong_AsUnsignedLongLong(out_ptr_obj);
  Py_DECREF(out_ptr_obj);
  char error[256];
  if (run_steps(r, ptrs, out_ptr, stream, error, sizeof error) < 0) {
    Py_DECREF(out);
    PyErr_SetString(PyExc_RuntimeError, error);
    return NULL;
  }
  return out;
}

// The recipe held for `key` (a new reference to bytes), run: the output; `key` itself when none is held (returned);
// None for a refused key or another context. Steals `key`.
static PyObject* replay_by_key(Replayer* self, PyObject* key, PyObject* const* args, const uint64_t* ptrs) {
  PyObject *found, *answer;
  int held = look_up(self->recipes, key, &found, &answer);  // refused: forward, every time
  if (held <= 0) return held < 0 ? NULL : answer;
  return run_recipe(self, (Recipe*)found, args, ptrs);
}

// replay(*args) -> the output; the call's key (bytes) when no recipe is held for it (Python runs forward, recording
// it, and adds a recipe or refuses the key); None when the call makes no key, its key was refused, or the recipe's
// CUDA context is not current (Python runs forward).
static PyObject* Replayer_replay(Replayer* self, PyObject* const* args, Py_ssize_t nargs) {
  uint64_t ptrs[MAX_ARGS];
  PyObject* key = replay_key(self, args, nargs, ptrs);
  if (key == NULL || key == Py_None) return key;
  return replay_by_key(self, key, args, ptrs);
}

// call(args, kwargs) -> as replay, for a call as a user makes it (the positional arguments as a tuple, the options
// given by keyword as a dict): tensors exactly torch.Tensor, none requiring grad, options by keyword of the kinds
// positional ones may be (their names are part of the key). None, besides replay's cases, when replays are off
// (`set_enabled`) or this thread is recording.
static PyObject* Replayer_call(Replayer* self, PyObject* const* argv, Py_ssize_t nargv) {
  if (nargv != 2 || !PyTuple_CheckExact(argv[0]) || !PyDict_CheckExact(argv[1])) {
    PyErr_SetString(PyExc_TypeError, "call(args: tuple, kwargs: dict)");
    return NULL;
  }
  if (!replays_on || recording_depth > 0) Py_RETURN_NONE;
  PyObject* const* args = &PyTuple_GET_ITEM(argv[0], 0);
  Py_ssize_t n = PyTuple_GET_SIZE(argv[0]);
  if (n > MAX_ARGS) Py_RETURN_NONE;
  uint64_t ptrs[MAX_ARGS];
  KeyBuf k;
  k.len = 0;
  int ok = call_key(self, args, n, &k, ptrs, 1);
  if (ok > 0 && PyDict_GET_SIZE(argv[1]) > 0) ok = keyword_key(argv[1], &k);
  if (ok < 0) return NULL;
  if (ok == 0) Py_RETURN_NONE;
  PyObject* key = PyBytes_FromStringAndSize((const char*)k.buf, k.len);
  if (key == NULL) return NULL;
  return replay_by_key(self, key, args, ptrs);
}

// add(key, recipe): replay calls of `key` (from `key`) by `recipe`.
static PyObject* Replayer_add(Replayer* self, PyObject* args) {
  PyObject* key;
  PyObject* recipe;
  if (!PyArg_ParseTuple(args, "SO!", &key, &RecipeType, &recipe)) return NULL;
  if (PyDict_Size(self->recipes) >= 4096) PyDict_Clear(self->recipes);  // a bound on the table, not an LRU
  if (PyDict_SetItem(self->recipes, key, recipe) < 0) return NULL;
  Py_RETURN_NONE;
}

// refuse(key): replay answers None for `key` from now on (a call no recipe can redo: forward runs, unrecorded).
static PyObject* Replayer_refuse(Replayer* self, PyObject* key) {
  if (!PyBytes_Check(key)) {
    PyErr_SetString(PyExc_TypeError, "refuse(key): key is the bytes replay() returned");
    return NULL;
  }
  if (PyDict_Size(self->recipes) >= 4096) PyDict_Clear(self->recipes);
  if (PyDict_SetItem(self->recipes, key, Py_None) < 0) return NULL;
  Py_RETURN_NONE;
}

// size() -> the number of recipes held (refused keys not counted).
static PyObject* Replayer_size(Replayer* self, PyObject* Py_UNUSED(ignored)) {
  Py_ssize_t pos = 0, n = 0;
  PyObject *key, *value;
  while (PyDict_Next(self->recipes, &pos, &key, &value)) n += value != Py_None;
  return PyLong_FromSsize_t(n);
}

// Replayer(dtypes, empty_like, contiguous_format, raw_stream, tensor_type)
static int Replayer_init(Replayer* self, PyObject* args, PyObject* kwds) {
  PyObject *dtypes, *empty_like, *contiguous, *raw_stream, *tensor_type;
  if (!PyArg_ParseTuple(args, "O!OOOO!", &PyDict_Type, &dtypes, &empty_like, &contiguous, &raw_stream, &PyType_Type,
                        &tensor_type))
    return -1;
  PyObject* kwargs = Py_BuildValue("{s:O}", "memory_format", contiguous);
  if (kwargs == NULL) return -1;
  Py_INCREF(dtypes);
  Py_INCREF(empty_like);
  Py_INCREF(raw_stream);
  Py_INCREF(tensor_type);
  Py_XSETREF(self->tensor_type, tensor_type);
  Py_XSETREF(self->dtypes, dtypes);
  Py_XSETREF(self->empty_like, empty_like);
  Py_XSETREF(self->raw_stream, raw_stream);
  Py_XSETREF(self->alloc_kwargs, kwargs);
  Py_XSETREF(self->recipes, PyDict_New());
  return self->recipes == NULL ? -1 : 0;
}

static void Replayer_dealloc(Replayer* self) {
  Py_XDECREF(self->dtypes);
  Py_XDECREF(self->recipes);
  Py_XDECREF(self->empty_like);
  Py_XDECREF(self->alloc_kwargs);
  Py_XDECREF(self->raw_stream);
  Py_XDECREF(self->tensor_type);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static PyMethodDef Replayer_methods[] = {
    {"replay", (PyCFunction)(void (*)(void))Replayer_replay, METH_FASTCALL,
     "replay(*args) -> the output, the key (no recipe yet), or None (forward runs)"},
    {"call", (PyCFunction)(void (*)(void))Replayer_call, METH_FASTCALL,
     "call(args, kwargs) -> replay's answer for a user's call (None also when replays are off or recording)"},
    {"key", (PyCFunction)(void (*)(void))Replayer_key, METH_FASTCALL, "key(*args) -> bytes or None"},
    {"add", (PyCFunction)Replayer_add, METH_VARARGS, "add(key, recipe)"},
    {"refuse", (PyCFunction)Replayer_refuse, METH_O, "refuse(key): forward runs for `key` from now on"},
    {"size", (PyCFunction)Replayer_size, METH_NOARGS, "number of recipes"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReplayerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fuselab_launcher.Replayer",
    .tp_basicsize = sizeof(Replayer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Replayer_init,
    .tp_dealloc = (destructor)Replayer_dealloc,
    .tp_methods = Replayer_methods,
    .tp_doc = "Replays one fused op's eager calls from their recipes (see the module's source).",
};

static PyTypeObject RecipeType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fuselab_launcher.Recipe",
    .tp_basicsize = sizeof(Recipe),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Recipe_init,
    .tp_dealloc = (destructor)Recipe_dealloc,
    .tp_members = Recipe_members,
    .tp_doc = "How to redo one key's call: the output's allocation and the launches.",
};

// set_enabled(on): whether Replayer.call replays (fuselab.ops.launcher.enabled keeps it in step).
static PyObject* set_enabled(PyObject* Py_UNUSED(m), PyObject* on) {
  int truth = PyObject_IsTrue(on);
  if (truth < 0) return NULL;
  replays_on = truth;
  Py_RETURN_NONE;
}

// recording(step): this thread enters (+1) or leaves (-1) a recording (fuselab.ops.launcher.recording).
static PyObject* recording(PyObject* Py_UNUSED(m), PyObject* step) {
  long v = PyLong_AsLong(step);
  if (v == -1 && PyErr_Occurred()) return NULL;
  recording_depth += (int)v;
  Py_RETURN_NONE;
}

// ------------------------------------------------------------------------------------------------ the C API

static int api_replays_on(void) { return replays_on; }
static int api_recording_depth(void) { return recording_depth; }
static int api_is_recipe(void* object) { return Py_IS_TYPE((PyObject*)object, &RecipeType); }
static int api_recipe_out_from(void* recipe) { return ((Recipe*)recipe)->out_from; }
static int api_recipe_device(void* recipe) { return ((Recipe*)recipe)->device; }
static int api_recipe_ready(void* recipe, void* stream) { return recipe_ready((Recipe*)recipe, stream); }
static int api_run_recipe(void* recipe, const uint64_t* ptrs, uint64_t out_ptr, void* stream, char* error,
                          size_t error_len) {
  return run_steps((Recipe*)recipe, ptrs, out_ptr, stream, error, error_len);
}

static FuselabLauncherApi api = {
    FUSELAB_LAUNCHER_API_VERSION, api_replays_on,  api_recording_depth, api_is_recipe,
    api_recipe_out_from,          api_recipe_device, api_recipe_ready,  api_run_recipe,
};

static PyMethodDef module_methods[] = {
    {"set_enabled", set_enabled, METH_O, "set_enabled(on): whether Replayer.call replays"},
    {"recording", recording, METH_O, "recording(+1 or -1): this thread enters or leaves a recording"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "fuselab_launcher", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit_fuselab_launcher(void) {
  if (PyType_Ready(&LauncherType) < 0 || PyType_Ready(&BinaryType) < 0 || PyType_Ready(&ReplayerType) < 0 ||
      PyType_Ready(&RecipeType) < 0)
    return NULL;
  str_data_ptr = PyUnicode_InternFromString("data_ptr");
  str_dtype = PyUnicode_InternFromString("dtype");
  str_is_cuda = PyUnicode_InternFromString("is_cuda");
  str_get_device = PyUnicode_InternFromString("get_device");
  str_shape = PyUnicode_InternFromString("shape");
  str_stride = PyUnicode_InternFromString("stride");
  str_requires_grad = PyUnicode_InternFromString("requires_grad");
  if (str_data_ptr == NULL || str_dtype == NULL || str_is_cuda == NULL || str_get_device == NULL ||
      str_shape == NULL || str_stride == NULL || str_requires_grad == NULL)
    return NULL;
  PyObject* m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  PyObject* capsule = PyCapsule_New(&api, "fuselab_launcher.api", NULL);
  if (capsule == NULL || PyModule_AddObject(m, "api", capsule) < 0) {
    Py_XDECREF(capsule);
    Py_DECREF(m);
    return NULL;
  }
  PyTypeObject* types[] = {&LauncherType, &ReplayerType, &RecipeType};
  const char* names[] = {"Launcher", "Replayer", "Recipe"};
  for (int i = 0; i < 3; i++) {
    Py_INCREF(types[i]);
    if (PyModule_AddObject(m, names[i], (PyObject*)types[i]) < 0) {
      Py_DECREF(types[i]);
      Py_DECREF(m);
      return NULL;
    }
  }
  return m;
}
