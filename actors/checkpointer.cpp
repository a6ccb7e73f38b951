// The checkpointer (messages/checkpointer.hpp): writes snapshots under its
// folder (write, fsync, rename, then `latest`: gpu::write_checkpoint) and
// keeps the newest `keep` complete ones in the folder, those of earlier
// processes of the run included (gpu::rotate_checkpoints; never the one just
// written).  Detached for its blocking file I/O.
#include <filesystem>
#include <memory>
#include <system_error>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/default_handler.hpp"
#include "actors/spawn.hpp"
#include "actors/time.hpp"
#include "actors/vitals.hpp"
#include "messages/errors.hpp"

namespace tandem {

namespace {

struct checkpointer_state {
  static inline const char* name = "tandem.checkpointer";
  std::filesystem::path dir;
  int keep = 3;
  std::filesystem::path pinned;  ///< never rotated away ("" = none)
  bool durable = true;           ///< fsynced (false: restore points, gpu::write_checkpoint)
  int64_t written = 0;
  double write_ms_last = 0;
};

checkpointer_actor::behavior_type
checkpointer_behavior(checkpointer_actor::stateful_pointer<checkpointer_state> self,
                      std::filesystem::path dir, int keep, std::filesystem::path pinned, bool durable,
                      bool own_thread) {
  install_default_handler(self, checkpointer_state::name);
  auto meter = std::make_shared<vitals_meter>(self->system(), "checkpointer", 0, own_thread);
  meter->figures = [self] {
    return std::vector<vitals_figure>{{"written", static_cast<double>(self->state.written)},
                                      {"write_ms_last", self->state.write_ms_last}};
  };
  self->state.dir = std::move(dir);
  self->state.keep = keep;
  self->state.pinned = std::move(pinned);
  self->state.durable = durable;
  return counted(meter, checkpointer_actor::behavior_type{
    vitals_handler(self, meter),
    [self](const snapshot_desc& snap, const std::string& extra) -> caf::result<std::string> {
      auto& s = self->state;
      const auto t0 = clock_type::now();
      auto target = s.dir / gpu::checkpoint_name(snap.step);
      // A killed worker's half-written checkpoint holds space this write
      // needs (the pre-write space check would fail on it).
      for (const auto& old : gpu::remove_killed_writes(s.dir))
        spdlog::info("removed {}, a write a killed process left", old.string());
      try {
        gpu::write_checkpoint(snap.handle, target, extra, s.durable);
      } catch (const std::exception& e) {
        gpu::transport::release(snap.handle);
        const std::string what = e.what();
        return make_error(errc::bad_input, what.find(target.string()) != std::string::npos
                                             ? "checkpoint: " + what  // it names the path already
                                             : "checkpoint " + target.string() + ": " + what);
      }
      gpu::transport::release(snap.handle);
      ++s.written;
      s.write_ms_last = ms_since(t0);
      for (const auto& old : gpu::rotate_checkpoints(s.dir, s.keep, {target, s.pinned}))
        spdlog::debug("checkpoint {} removed (checkpoint.keep = {})", old.string(), s.keep);
      return target.string();
    },
    [self](shutdown_atom) { self->quit(); },
  });
}

} // namespace

template <caf::spawn_options Os>
checkpointer_actor spawn_checkpointer(caf::actor_system& sys, std::filesystem::path dir, int keep,
                                      std::filesystem::path pinned, bool durable) {
  return sys.spawn<Os>(checkpointer_behavior, std::move(dir), keep, std::move(pinned), durable,
                       Os == caf::detached);
}

// Production (detached) and the deterministic test scheduler (scheduled).
template checkpointer_actor spawn_checkpointer<caf::detached>(caf::actor_system&, std::filesystem::path, int,
                                                              std::filesystem::path, bool);
template checkpointer_actor spawn_checkpointer<caf::no_spawn_options>(caf::actor_system&, std::filesystem::path, int,
                                                                      std::filesystem::path, bool);

} // namespace tandem
