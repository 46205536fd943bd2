/*
 * Host-side pieces of the operators (multi_update_op.cc): attribute parsing, the OpenMP
 * split of a range, and the memory-overlap check. The per-element math is in
 * local_update_kernels.h (shared with CUDA); nothing here runs on a GPU.
 */
#ifndef ODSGD_KVSTORE_EXT_OP_COMMON_H_
#define ODSGD_KVSTORE_EXT_OP_COMMON_H_

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <system_error>
#include <unordered_map>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "lib_api.h"

// lib_api's names every operator file of the library uses
using mxnet::ext::MXReturnValue;
using mxnet::ext::MXTensor;
using mxnet::ext::MX_FAIL;
using mxnet::ext::MX_SUCCESS;
using mxnet::ext::OpResource;

namespace odsgd {

using Attrs = std::unordered_map<std::string, std::string>;

// ---------------------------------------------------------------------------------------
// Attributes. MXNet hands every attribute over as a string; these parse them and record a
// message naming the operator and the attribute when they cannot.

/*! \brief Parses a whole string as a finite double. std::from_chars ignores the C locale
 *  (strtod would follow LC_NUMERIC, which a host program may have changed) and is much
 *  faster than a stringstream, which matters for the per-array rate lists. */
inline bool ParseDouble(const char* begin, const char* end, double* out) {
  while (begin < end && *begin == ' ') ++begin;
  if (begin < end && *begin == '+') ++begin;
  double value = 0.0;
  const std::from_chars_result r = std::from_chars(begin, end, value);
  if (r.ec != std::errc() || r.ptr != end || !std::isfinite(value)) return false;
  *out = value;
  return true;
}

inline bool ParseDouble(const std::string& text, double* out) {
  return ParseDouble(text.data(), text.data() + text.size(), out);
}

inline bool GetNumber(const Attrs& attrs, const char* op, const char* key, double* out) {
  const auto it = attrs.find(key);
  if (it == attrs.end()) {
    MX_ERROR_MSG << op << ": missing attribute '" << key << "'";
    return false;
  }
  if (!ParseDouble(it->second, out)) {
    MX_ERROR_MSG << op << ": attribute '" << key << "' must be a finite number, got '"
                 << it->second << "'";
    return false;
  }
  return true;
}

inline bool GetFlag(const Attrs& attrs, const char* op, const char* key, bool* out) {
  const auto it = attrs.find(key);
  if (it == attrs.end()) {
    MX_ERROR_MSG << op << ": missing attribute '" << key << "'";
    return false;
  }
  const std::string& v = it->second;
  // Python's str(True) is 'True'; accept that as well as 0/1.
  if (v == "1" || v == "True" || v == "true") {
    *out = true;
  } else if (v == "0" || v == "False" || v == "false") {
    *out = false;
  } else {
    MX_ERROR_MSG << op << ": attribute '" << key << "' must be 0 or 1, got '" << v << "'";
    return false;
  }
  return true;
}

/*! \brief An integer attribute in [minimum, maximum]. */
inline bool GetCount(const Attrs& attrs, const char* op, const char* key, int64_t minimum,
                     int64_t maximum, int64_t* out) {
  double value = 0.0;
  if (!GetNumber(attrs, op, key, &value)) return false;
  if (!(value >= static_cast<double>(minimum) && value <= static_cast<double>(maximum)) ||
      value != std::floor(value)) {
    MX_ERROR_MSG << op << ": attribute '" << key << "' must be an integer in [" << minimum
                 << ", " << maximum << "], got '" << attrs.at(key) << "'";
    return false;
  }
  *out = static_cast<int64_t>(value);
  return true;
}

/*! \brief A comma-separated list of `count` finite numbers, rounded to float32; a single
 *  number stands for `count` copies of itself (the Python side sends one when all agree). */
inline bool GetFloatList(const Attrs& attrs, const char* op, const char* key, int64_t count,
                         std::vector<float>* out) {
  const auto it = attrs.find(key);
  if (it == attrs.end()) {
    MX_ERROR_MSG << op << ": missing attribute '" << key << "'";
    return false;
  }
  const std::string& text = it->second;
  out->clear();
  out->reserve(static_cast<size_t>(count));
  const char* p = text.data();
  const char* const end = p + text.size();
  while (p <= end && static_cast<int64_t>(out->size()) <= count) {
    const char* comma = std::find(p, end, ',');
    double value = 0.0;
    if (!ParseDouble(p, comma, &value)) {
      MX_ERROR_MSG << op << ": attribute '" << key << "' item " << out->size()
                   << " is not a finite number (expected " << count
                   << " comma-separated numbers)";
      return false;
    }
    out->push_back(static_cast<float>(value));
    p = comma + 1;
  }
  if (out->size() == 1) out->resize(static_cast<size_t>(count), (*out)[0]);
  if (static_cast<int64_t>(out->size()) != count) {
    MX_ERROR_MSG << op << ": attribute '" << key << "' has " << out->size()
                 << " numbers but num_arrays is " << count << " (give one, or one per array)";
    return false;
  }
  return true;
}

/*! \brief Refuses attributes not in `known`: a misspelt one would otherwise be ignored
 *  silently. Keys starting with "__" are MXNet's own (dtype/shape/profiler annotations). */
inline bool CheckKnownAttrs(const Attrs& attrs, const char* op,
                            const std::vector<const char*>& known) {
  for (const auto& kv : attrs) {
    if (kv.first.rfind("__", 0) == 0) continue;
    const bool ok = std::any_of(known.begin(), known.end(),
                                [&](const char* k) { return kv.first == k; });
    if (!ok) {
      std::ostringstream list;
      for (size_t i = 0; i < known.size(); ++i) list << (i ? ", " : "") << known[i];
      MX_ERROR_MSG << op << ": unknown attribute '" << kv.first << "'; expected: "
                   << list.str();
      return false;
    }
  }
  return true;
}

inline std::string ShapeString(const std::vector<unsigned int>& shape) {
  std::ostringstream s;
  s << "(";
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? "," : "") << shape[i];
  if (shape.size() == 1) s << ",";
  s << ")";
  return s.str();
}

inline int64_t NumElements(const std::vector<unsigned int>& shape) {
  int64_t n = 1;
  for (unsigned int d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------------------
// Threads

// Below this many elements per thread, starting threads costs more than it saves:
// 32768 floats is 128 KiB per array, tens of microseconds of memory traffic per thread.
constexpr int64_t kMinElementsPerThread = 1 << 15;

// MXNet's engine sets the OpenMP thread count of each CPU worker thread it runs operators on
// (omp_set_num_threads) to its own recommendation: OMP_NUM_THREADS, else
// MXNET_OMP_MAX_THREADS, else half the logical CPUs on x86. omp_get_max_threads() here
// therefore gives these operators the same number of threads as MXNet's built-in ones.
inline int ThreadsFor(int64_t n) {
#if defined(_OPENMP)
  const int max_threads = omp_get_max_threads();
  const int64_t by_size = n / kMinElementsPerThread;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(max_threads, by_size)));
#else
  (void)n;
  return 1;
#endif
}

/*!
 * \brief Runs fn(begin, end) over [0, n) split statically into one contiguous chunk per
 *  thread. Chunk boundaries are multiples of 16 floats (64 bytes, a cache line) so that no
 *  two threads write the same line of one array.
 */
template <typename RangeFn>
void ParallelFor(int64_t n, RangeFn fn) {
  const int threads = ThreadsFor(n);
  if (threads <= 1) {
    fn(0, n);
    return;
  }
#if defined(_OPENMP)
#pragma omp parallel num_threads(threads)
  {
    const int64_t team = omp_get_num_threads();
    const int64_t chunk = (((n + team - 1) / team) + 15) & ~static_cast<int64_t>(15);
    const int64_t begin = std::min<int64_t>(n, omp_get_thread_num() * chunk);
    const int64_t end = std::min<int64_t>(n, begin + chunk);
    if (begin < end) fn(begin, end);
  }
#endif
}

// ---------------------------------------------------------------------------------------
// Memory overlap. The kernels declare their pointers __restrict__ (needed for
// vectorisation), which is only valid if no array they write shares memory with another.

/*! \brief Byte range [begin, end) of a dense float32 tensor, with a name for messages. */
struct Span {
  const char* begin;
  const char* end;
  std::string name;
  bool written;
};

inline Span SpanOf(const mxnet::ext::MXTensor& t, std::string name, bool written) {
  const char* b = static_cast<const char*>(t.data_ptr);
  return {b, b + t.size() * static_cast<int64_t>(sizeof(float)), std::move(name), written};
}

/*! \brief Records a message and returns false when a written span shares memory with any
 *  other span (read-only spans may share memory with each other). O(n log n). */
inline bool CheckNoOverlap(const char* op, std::vector<Span> spans, const char* hint) {
  spans.erase(std::remove_if(spans.begin(), spans.end(),
                             [](const Span& s) { return s.begin == s.end; }),
              spans.end());
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t i = 0; i < spans.size(); ++i) {
    for (size_t j = i + 1; j < spans.size() && spans[j].begin < spans[i].end; ++j) {
      if (spans[i].written || spans[j].written) {
        MX_ERROR_MSG << op << ": '" << (spans[i].written ? spans[i].name : spans[j].name)
                     << "' shares memory with '"
                     << (spans[i].written ? spans[j].name : spans[i].name) << "'; " << hint;
        return false;
      }
    }
  }
  return true;
}

}  // namespace odsgd

#endif  // ODSGD_KVSTORE_EXT_OP_COMMON_H_
