// Numbers as text for the bindings' TORCH_CHECK messages, made without a std::ostream. On the H200 machine
// (torch 2.11+cu130) every extension built there, a minimal load_inline one included, died of SIGSEGV where a
// message inserted a number into an ostream (c10::str, which TORCH_CHECK uses, does), while text and numbers made
// text by std::to_string raised (scripts/probe_binding_errors.py; docs/ops/softmax.md). So no integer, size or
// shape goes to TORCH_CHECK as a number: it goes through here.
#pragma once

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>

namespace fuselab::text {

// 5 -> "5"
inline std::string number(int64_t n) { return std::to_string(n); }

// sizes (2, 3, 5) -> "[2, 3, 5]", as torch prints them
inline std::string shape(c10::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(sizes[i]);
  }
  return out + "]";
}

}  // namespace fuselab::text
