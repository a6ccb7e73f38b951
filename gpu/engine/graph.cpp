#include "gpu/engine/graph.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "gpu/device/env.hpp"
#include "gpu/device/error.hpp"

#ifdef TANDEM_HAVE_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <cuda_runtime_api.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace tandem::gpu {

namespace {

std::atomic<int64_t> capture_count{0};
std::atomic<int64_t> in_capture{0};
std::atomic<int64_t> max_in_capture{0};

/// Counts a capture in progress (measured, so a test can show the lock holds).
struct capture_in_progress {
  capture_in_progress() {
    const auto now = ++in_capture;
    auto seen = max_in_capture.load();
    while (now > seen && !max_in_capture.compare_exchange_weak(seen, now)) {
    }
  }
  ~capture_in_progress() { --in_capture; }
};

std::atomic<int64_t> turns_taken{0};

#ifdef TANDEM_HAVE_CUDA
/// A turn timed for TANDEM_TURN_TIMING: events around its replay.
struct timed_turn {
  cudaEvent_t start = nullptr, end = nullptr;
  std::string who;
};

/// TANDEM_TURN_TIMING's figures for one device since its last report.
struct turn_figures {
  std::map<std::string, std::pair<double, int64_t>> busy;  ///< by engine: device ms in turns, turns
  /// The time between the end of one turn and the next's start: the device
  /// idle, or busy with work that is not a turn (side-stream copies, an
  /// eager or capturing step).
  double between_ms = 0, between_max_ms = 0;
  int64_t turns = 0;
};

/// One device's training turns: the end of the last one, and the lock that
/// keeps "wait for the last, launch, record the end" in one piece.
struct device_turn_state {
  std::mutex lock;
  cudaEvent_t last = nullptr;  ///< created on first use, on the device; never destroyed (process lifetime)
  bool any = false;
  // TANDEM_TURN_TIMING only:
  std::deque<timed_turn> timed;      ///< launched, not yet read
  cudaEvent_t previous_end = nullptr;  ///< the end of the last turn read
  std::vector<cudaEvent_t> spare;    ///< events to reuse
  turn_figures figures;
};

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw error(errc::device_failure, std::string(what) + ": " + cudaGetErrorString(e));
}

device_turn_state& turn_state(int device) {
  // Never destroyed: a thread still replaying at exit finds it alive.
  static auto* table_lock = new std::mutex;
  static auto* table = new std::vector<std::unique_ptr<device_turn_state>>;
  std::lock_guard<std::mutex> g(*table_lock);
  const auto at = static_cast<size_t>(device < 0 ? 0 : device);
  if (at >= table->size())
    table->resize(at + 1);
  auto& t = (*table)[at];
  if (!t)
    t = std::make_unique<device_turn_state>();
  return *t;
}
#endif

#ifdef TANDEM_HAVE_CUDA
/// TANDEM_TURN_TIMING: report every this many turns of a device (0: off).
int64_t turn_timing_every() {
  static const int64_t every = [] {
    const char* v = std::getenv("TANDEM_TURN_TIMING");
    if (!v || !*v)
      return int64_t{0};
    const std::string text = v;
    // Digits only (no sign, no spaces), at most 9 of them.
    if (text.size() > 9 || text.find_first_not_of("0123456789") != std::string::npos)
      throw error(errc::bad_input, "TANDEM_TURN_TIMING='" + text + "' is not a count of turns (0: off)");
    return static_cast<int64_t>(std::stoll(text));
  }();
  return every;
}
#endif

} // namespace

bool device_turns_enabled() {
  static const bool on = [] {
    return env_choice("TANDEM_SHARED_GPU", {"turns", "concurrent"}) == "turns";
  }();
  return on;
}

int64_t device_turns_taken() {
  return turns_taken.load();
}

int64_t captures_in_process() {
  return capture_count.load();
}

int64_t max_concurrent_captures() {
  return max_in_capture.load();
}

#ifdef TANDEM_HAVE_CUDA

namespace {

/// The one lock every capture in the process holds (see graph.hpp).
std::mutex& capture_mutex() {
  static std::mutex m;
  return m;
}

} // namespace

captured_step::captured_step(const at::Device& device)
  : device_(device), stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index())) {
  if (!device.is_cuda())
    throw error(errc::bad_input, "captured_step: " + device.str() + " is not a CUDA device");
}

captured_step::~captured_step() {
  reset();
}

void captured_step::capture(const std::function<void()>& body,
                            const std::vector<at::Generator>& generators) {
  c10::cuda::CUDAGuard device_guard(device_);
  c10::cuda::CUDAStreamGuard stream_guard(stream_);
  // Work queued before the capture must not be captured or overlap it.  Wait
  // for it before taking the process-wide lock: only this thread queues on
  // this stream, and no device wait (a collective waiting for a peer that
  // itself waits for the lock, say) may happen while the lock is held.
  stream_.synchronize();
  std::lock_guard<std::mutex> lock(capture_mutex());
  capture_in_progress counted;
  auto graph = std::make_unique<at::cuda::CUDAGraph>();
  try {
    for (const auto& g : generators)
      graph->register_generator_state(g);
    graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    try {
      body();
    } catch (...) {
      // End the capture so the stream is usable again; the partial graph is dropped.
      try {
        graph->capture_end();
      } catch (...) {
      }
      throw;
    }
    graph->capture_end();
  } catch (const c10::Error& e) {
    throw error(errc::device_failure, "graph capture on " + device_.str() + " failed: "
                                        + e.what_without_backtrace());
  }
  // The pool's size: once per capture, a walk over the allocator's segments.
  const auto pool = graph->pool();
  int64_t bytes = 0;
  for (const auto& seg : c10::cuda::CUDACachingAllocator::snapshot({0, 0}, false).segments)
    if (seg.device == device_.index() && seg.owner_private_pool_id == pool)
      bytes += static_cast<int64_t>(seg.total_size);
  pool_bytes_ = bytes;
  graph_ = std::move(graph);
  ++capture_count;
}

namespace {

/// Reads the timed turns of `t` that have ended (TANDEM_TURN_TIMING) and
/// prints the figures to stderr every turn_timing_every() of them.  Under t.lock.
void read_timed_turns(device_turn_state& t, int device) {
  auto elapsed = [](cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, a, b), "turn timing: cudaEventElapsedTime");
    return static_cast<double>(ms);
  };
  while (!t.timed.empty()) {
    auto& front = t.timed.front();
    const auto rc = cudaEventQuery(front.end);
    if (rc == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return;
    }
    check_cuda(rc, "turn timing: cudaEventQuery");
    auto& f = t.figures;
    auto& b = f.busy[front.who];
    b.first += elapsed(front.start, front.end);
    ++b.second;
    if (t.previous_end) {
      const double gap = std::max(0.0, elapsed(t.previous_end, front.start));
      f.between_ms += gap;
      f.between_max_ms = std::max(f.between_max_ms, gap);
      t.spare.push_back(t.previous_end);
    }
    t.spare.push_back(front.start);
    t.previous_end = front.end;
    t.timed.pop_front();
    if (++f.turns % turn_timing_every() == 0) {
      std::string line = "turn timing: cuda:" + std::to_string(device) + ", " + std::to_string(f.turns) + " turns:";
      double busy = 0;
      for (const auto& [who, v] : f.busy) {
        busy += v.first;
        char part[160];
        std::snprintf(part, sizeof part, " %s %.2f ms a turn (%lld),", who.c_str(), v.first / static_cast<double>(v.second),
                      static_cast<long long>(v.second));
        line += part;
      }
      char tail[200];
      std::snprintf(tail, sizeof tail, " in turns %.1f ms, between turns %.1f ms (%.2f%%, longest %.2f ms)\n", busy,
                    f.between_ms, 100.0 * f.between_ms / std::max(1e-9, busy + f.between_ms), f.between_max_ms);
      line += tail;
      std::fputs(line.c_str(), stderr);
      f = turn_figures{};
    }
  }
}

} // namespace

void captured_step::replay(bool take_turn, const char* who) {
  if (!graph_)
    throw error(errc::bad_input, "captured_step: replay before capture");
  c10::cuda::CUDAGuard device_guard(device_);
  c10::cuda::CUDAStreamGuard stream_guard(stream_);
  if (!take_turn || !device_turns_enabled()) {
    graph_->replay();
    return;
  }
  auto& t = turn_state(stream_.device_index());
  std::lock_guard<std::mutex> hold(t.lock);
  if (!t.last)
    check_cuda(cudaEventCreateWithFlags(&t.last, cudaEventDisableTiming), "device turns: cudaEventCreate");
  if (t.any)
    check_cuda(cudaStreamWaitEvent(stream_.stream(), t.last, 0), "device turns: cudaStreamWaitEvent");
  const bool timing = turn_timing_every() > 0;
  timed_turn timed;
  try {
    if (timing) {
      read_timed_turns(t, stream_.device_index());
      for (auto* e : {&timed.start, &timed.end}) {
        if (!t.spare.empty()) {
          *e = t.spare.back();
          t.spare.pop_back();
        } else
          check_cuda(cudaEventCreate(e), "turn timing: cudaEventCreate");
      }
      timed.who = who;
      check_cuda(cudaEventRecord(timed.start, stream_.stream()), "turn timing: cudaEventRecord");
    }
    graph_->replay();
    if (timing) {
      check_cuda(cudaEventRecord(timed.end, stream_.stream()), "turn timing: cudaEventRecord");
      t.timed.push_back(std::move(timed));
    }
  } catch (...) {
    for (auto e : {timed.start, timed.end})  // not pushed: back to the spares
      if (e)
        t.spare.push_back(e);
    throw;
  }
  check_cuda(cudaEventRecord(t.last, stream_.stream()), "device turns: cudaEventRecord");
  t.any = true;
  ++turns_taken;
}

void captured_step::reset() {
  if (!graph_)
    return;
  c10::cuda::CUDAGuard device_guard(device_);
  stream_.synchronize();
  // Under the capture lock: a graph's destructor unregisters it from the
  // generator states it captured, the device's default CUDA generator
  // always among them (CUDAGraph::capture_begin registers it), and
  // LibTorch guards neither that nor the registration at capture with a
  // lock.  Two engines on one GPU ending together, or a drafter restarted
  // while the target captures, would otherwise edit one set at once.
  std::lock_guard<std::mutex> lock(capture_mutex());
  graph_.reset();
}

#endif

} // namespace tandem::gpu
