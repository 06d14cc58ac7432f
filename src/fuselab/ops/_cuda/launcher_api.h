// What the launcher's C module (launcher.c) gives another extension: the replays' C++ autograd (replay.cpp) runs
// the launcher's Recipes through it, without Python. The module's attribute `api` is a capsule named
// "fuselab_launcher.api" holding one FuselabLauncherApi. Every function reads C state only: none takes Python's
// lock, so autograd's device threads may call them.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FUSELAB_LAUNCHER_API_VERSION 3
// A Recipe's limits: the launches it holds and the outputs it allocates (the module's MAX_STEPS, MAX_OUTPUTS).
#define FUSELAB_RECIPE_MAX_STEPS 8
#define FUSELAB_RECIPE_MAX_OUTPUTS 4

typedef struct {
  int version;  // FUSELAB_LAUNCHER_API_VERSION
  // Whether replays are on (fuselab.ops.launcher.enabled), and this thread's depth in recordings.
  int (*replays_on)(void);
  int (*recording_depth)(void);
  // Whether `object` (a PyObject*) is a Recipe; then how many outputs it allocates (1 to FUSELAB_RECIPE_MAX_OUTPUTS),
  // output j's sizes (its rank, dtype number (the launcher's) and strides (elements) into *rank, *dtype and
  // *strides), and the device it runs on.
  int (*is_recipe)(void* object);
  int (*recipe_outputs)(void* recipe);
  const int64_t* (*recipe_output)(void* recipe, int j, int* rank, int* dtype, const int64_t** strides);
  int (*recipe_device)(void* recipe);
  // Whether the recipe may run now on `stream`: its CUDA context current, and if it holds workspaces, `stream` theirs
  // and not capturing a CUDA graph.
  int (*recipe_ready)(void* recipe, void* stream);
  // Run the recipe's launches on `stream`, each pointer (a descriptor's base) patched to ptrs[argument index] or, for
  // output j, to out_ptrs[j]: 0; -1 with a message in error (error_len bytes at most) when a launch failed.
  int (*run_recipe)(void* recipe, const uint64_t* ptrs, const uint64_t* out_ptrs, void* stream, char* error,
                    size_t error_len);
} FuselabLauncherApi;

#ifdef __cplusplus
}
#endif
