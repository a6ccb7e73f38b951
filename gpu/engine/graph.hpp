#pragma once
/// Captured steps (DESIGN.md §1, §4): one CUDA graph per engine and shape
/// bucket, owned by the engine on its actor's thread.
///
/// Capture is serialised process-wide by design: LibTorch 2.11 crashed when
/// several threads captured their first graphs at once ("The graph should be
/// registered to the state", the CUDA generator registration race), so every
/// capture in this process, of any engine, holds one capture lock from
/// capture_begin to instantiate.  Replays are not serialised, except the
/// training turns of engines that share a device (replay(take_turn), below).
///
/// Per graph: its own side stream (warm-up, capture and replay all run on
/// it), cudaStreamCaptureModeThreadLocal (other threads' CUDA calls are not
/// disturbed by this capture), a private memory pool, and the generators the
/// body draws from registered, so each replay advances them as the eager
/// step would.  The body must touch only tensors whose addresses stay fixed
/// (static inputs filled before each replay, parameters, optimizer state).
/// gpu/ only (torch).

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "gpu/pch.hpp"

#ifdef TANDEM_HAVE_CUDA
namespace at::cuda {
struct CUDAGraph;
}
#endif

namespace tandem::gpu {

/// Captures completed in this process so far (every engine).
int64_t captures_in_process();

/// The most captures that were ever in progress at the same moment in this
/// process: 1 once anything was captured (the capture lock), 0 before.
int64_t max_concurrent_captures();

/// Training turns on a shared GPU.  When a target and a drafter share a
/// device, their graphs (the target's forward, the drafter's step) replayed
/// with take_turn run one after the other, in the order they were launched:
/// each such replay's stream first waits for the end of the previous one on
/// that device (a CUDA event; no host thread blocks).  Run side by side, the
/// two took each other's SMs and caches: docs/bench.md ("Kept: training turns on a shared GPU")
/// has the A/B.  `TANDEM_SHARED_GPU=concurrent` turns it off (read once).
bool device_turns_enabled();

/// Replays taken as turns so far in this process (every device).
int64_t device_turns_taken();

#ifdef TANDEM_HAVE_CUDA

class captured_step {
public:
  /// A graph-to-be on `device` (CUDA) with a fresh side stream from the pool.
  explicit captured_step(const at::Device& device);
  ~captured_step();
  captured_step(const captured_step&) = delete;
  captured_step& operator=(const captured_step&) = delete;

  /// The stream warm-up, capture and replay run on.
  c10::cuda::CUDAStream stream() const { return stream_; }

  bool captured() const { return graph_ != nullptr; }
  /// Bytes of the graph's private memory pool, counted right after its
  /// capture (the caching allocator's segments it owns); 0 before.
  int64_t pool_bytes() const { return graph_ ? pool_bytes_ : 0; }

  /// Records `body` into the graph, holding the process capture lock.  The
  /// body runs on stream() (made current here); nothing executes until
  /// replay().  Throws gpu::error(device_failure) with LibTorch's message
  /// when capture fails (the graph is left uncaptured).
  void capture(const std::function<void()>& body, const std::vector<at::Generator>& generators);

  /// Launches the graph on stream(); asynchronous.  take_turn: the replay is
  /// one of the device's training turns (device_turns_enabled(), above);
  /// `who` names the engine in TANDEM_TURN_TIMING's lines (docs/environment.md).
  void replay(bool take_turn = false, const char* who = "");

  /// Drops the graph and its memory pool (a restarted engine captures
  /// anew), after its stream's work, holding the process capture lock (the
  /// destructor calls it).
  void reset();

private:
  // No tensors here: the static buffers a graph touches belong to the
  // engine that owns this captured_step, each with its shape comment
  // (drafter_engine.cpp: impl::step_graph and the impl's fields).
  at::Device device_;
  c10::cuda::CUDAStream stream_;
  std::unique_ptr<at::cuda::CUDAGraph> graph_;  ///< null until capture(); its private memory pool
  int64_t pool_bytes_ = 0;
};

#endif

} // namespace tandem::gpu
