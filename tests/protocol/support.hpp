#pragma once
/// What the protocol suites share: the actor-system config, field-by-field
/// equality of the descriptors (every field written out, so a field that
/// inspect() forgets shows up as a round-trip mismatch), scratch folders,
/// a small token dataset written in C++, a recording coordinator for the
/// worker suites, and event-based helpers that record a request's answer or
/// an actor's exit reason (never a blocking receive: a test that gets no
/// answer fails instead of hanging).
///
/// Everything runs on CAF's deterministic scheduler, on the test thread, so
/// the recorders below are plain shared structs read by the test body.

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "messages/control.hpp"
#include "messages/coordinator.hpp"
#include "messages/errors.hpp"
#include "messages/registry.hpp"
#include "messages/supervisor.hpp"

/// CAF_CHECK with an explanation printed when it fails.
#define TANDEM_CHECK_MSG(cond, msg)                                                               \
  do {                                                                                            \
    if (cond) {                                                                                   \
      CAF_CHECK(true);                                                                            \
    } else {                                                                                      \
      CAF_ERROR(#cond << ": " << msg);                                                            \
    }                                                                                             \
  } while (false)

namespace tandem {

// -- equality, every field -------------------------------------------------

inline bool operator==(const device_ref& a, const device_ref& b) {
  return a.node == b.node && a.device == b.device;
}

inline bool operator==(const batch_desc& a, const batch_desc& b) {
  return a.batch_id == b.batch_id && a.epoch == b.epoch && a.generation == b.generation && a.source == b.source
         && a.sample_ids == b.sample_ids && a.rows == b.rows && a.seq_len == b.seq_len
         && a.real_tokens == b.real_tokens && a.where == b.where && a.handle == b.handle;
}

inline bool operator==(const features_desc& a, const features_desc& b) {
  return a.batch_id == b.batch_id && a.target == b.target && a.shape == b.shape
         && a.where == b.where && a.handle == b.handle && a.forward_ms == b.forward_ms
         && a.dtype == b.dtype && a.host == b.host && a.producer == b.producer;
}

inline bool operator==(const wire_tensor& a, const wire_tensor& b) {
  return a.shape == b.shape && a.dtype == b.dtype;
}

inline bool operator==(const payload_spec& a, const payload_spec& b) {
  return a.tensors == b.tensors;
}

inline bool operator==(const pulled& a, const pulled& b) {
  return a.payloads == b.payloads;
}

inline bool operator==(const work_item& a, const work_item& b) {
  return a.batch == b.batch && a.features == b.features && a.contribute == b.contribute;
}

inline bool operator==(const step_report& a, const step_report& b) {
  return a.drafter == b.drafter && a.step == b.step && a.batch_id == b.batch_id
         && a.loss == b.loss && a.accuracy == b.accuracy && a.grad_norm == b.grad_norm
         && a.lr == b.lr && a.scored_tokens == b.scored_tokens && a.real_tokens == b.real_tokens
         && a.finite == b.finite && a.compute_ms == b.compute_ms && a.wait_ms == b.wait_ms
         && a.contributed == b.contributed && a.group_failed == b.group_failed;
}

inline bool operator==(const group_spec& a, const group_spec& b) {
  return a.nccl_id == b.nccl_id && a.rank == b.rank && a.world == b.world
         && a.generation == b.generation && a.timeout_s == b.timeout_s;
}

inline bool operator==(const snapshot_desc& a, const snapshot_desc& b) {
  return a.drafter == b.drafter && a.step == b.step && a.handle == b.handle;
}

inline bool operator==(const run_summary& a, const run_summary& b) {
  return a.steps == b.steps && a.epochs_completed == b.epochs_completed
         && a.samples_committed == b.samples_committed && a.last_loss == b.last_loss
         && a.first_loss == b.first_loss && a.stop_reason == b.stop_reason
         && a.checkpoint == b.checkpoint;
}

inline bool operator==(const control_command& a, const control_command& b) {
  return a.action == b.action && a.source == b.source;
}

inline bool operator==(const control_request& a, const control_request& b) {
  return a.method == b.method && a.target == b.target && a.body == b.body && a.source == b.source;
}

inline bool operator==(const control_reply& a, const control_reply& b) {
  return a.status == b.status && a.body == b.body;
}

/// An actor's vitals figures by name.
inline std::map<std::string, double> figures_of(const actor_vitals& v) {
  std::map<std::string, double> out;
  for (const auto& f : v.figures)
    out[f.name] = f.value;
  return out;
}

inline bool operator==(const vitals_figure& a, const vitals_figure& b) {
  return a.name == b.name && a.value == b.value;
}

inline bool operator==(const actor_vitals& a, const actor_vitals& b) {
  return a.role == b.role && a.index == b.index && a.actor_id == b.actor_id && a.answered == b.answered
         && a.down == b.down && a.own_thread == b.own_thread && a.thread == b.thread && a.thread_name == b.thread_name
         && a.uptime_s == b.uptime_s && a.handled == b.handled && a.last_message == b.last_message
         && a.last_message_age_s == b.last_message_age_s && a.busiest_ms == b.busiest_ms && a.figures == b.figures;
}

inline bool operator==(const restart_plan& a, const restart_plan& b) {
  return a.restart == b.restart && a.budget == b.budget && a.backoff_s == b.backoff_s;
}

inline bool operator==(const coordinator_peers& a, const coordinator_peers& b) {
  return a.prefetch == b.prefetch && a.targets == b.targets && a.drafters == b.drafters
         && a.checkpointer == b.checkpointer && a.metrics == b.metrics;
}

} // namespace tandem

namespace tandem::test {

namespace fs = std::filesystem;

struct config : caf::actor_system_config {
  config() {
    register_messages(*this);
  }
};

/// A folder of its own, removed with the object.
struct scratch {
  fs::path dir;
  scratch() {
    static std::atomic<int> counter{0};
    dir = fs::temp_directory_path()
          / ("tandem_protocol_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;
};

/// Length of sample `k` of write_dataset's data.
inline int64_t sample_length(int64_t k) {
  return 40 + (k * 37) % 90;  // 40 .. 129 tokens: one to six samples per 256-token row
}

/// A dataset in the format of docs/data.md (manifest.json + one shard),
/// written here so that the suite needs no Python: `n` samples, token ids
/// below `vocab` (the parity fixtures' tiny Qwen3 has 512), the first third
/// of each sample unsupervised.  Hashes are left empty (not verified unless
/// verify_hashes is set).
inline void write_dataset(const fs::path& dir, int64_t n, int64_t vocab = 512) {
  fs::create_directories(dir);
  std::vector<int64_t> offsets{0};
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  int64_t supervised = 0;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t len = sample_length(k);
    for (int64_t j = 0; j < len; ++j) {
      tokens.push_back(static_cast<int32_t>((k * 7 + (j % 8) * 13) % (vocab - 12)));
      const bool sup = j >= len / 3;
      mask.push_back(sup ? 1 : 0);
      supervised += sup;
    }
    offsets.push_back(static_cast<int64_t>(tokens.size()));
  }
  const auto t = static_cast<int64_t>(tokens.size());
  // Widest dtype first, so each tensor is aligned to its element size.
  const int64_t off_bytes = 8 * (n + 1), tok_bytes = 4 * t, mask_bytes = t;
  nlohmann::json h;
  h["__metadata__"] = {{"format", "tandem.shard.v1"},
                       {"num_samples", std::to_string(n)},
                       {"num_tokens", std::to_string(t)}};
  h["offsets"] = {{"dtype", "I64"}, {"shape", {n + 1}}, {"data_offsets", {0, off_bytes}}};
  h["tokens"] = {{"dtype", "I32"}, {"shape", {t}},
                 {"data_offsets", {off_bytes, off_bytes + tok_bytes}}};
  h["loss_mask"] = {{"dtype", "U8"}, {"shape", {t}},
                    {"data_offsets", {off_bytes + tok_bytes, off_bytes + tok_bytes + mask_bytes}}};
  auto header = h.dump();
  while (header.size() % 8 != 0)
    header += ' ';
  {
    std::ofstream f(dir / "shard-00000.safetensors", std::ios::binary);
    const uint64_t len = header.size();  // little-endian on every host we build for
    f.write(reinterpret_cast<const char*>(&len), 8);
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
    f.write(reinterpret_cast<const char*>(offsets.data()), off_bytes);
    f.write(reinterpret_cast<const char*>(tokens.data()), tok_bytes);
    f.write(reinterpret_cast<const char*>(mask.data()), mask_bytes);
  }
  nlohmann::json m{
    {"format", "tandem.dataset.v1"},
    {"created_by", "tests/protocol/support.hpp"},
    {"tokenizer", {{"source", "synthetic"}, {"vocab_size", vocab}, {"sha256", ""}}},
    {"shards", {{{"file", "shard-00000.safetensors"}, {"num_samples", n}, {"num_tokens", t},
                 {"num_supervised", supervised}, {"sha256", ""}}}},
    {"totals", {{"samples", n}, {"tokens", t}, {"supervised", supervised}}},
  };
  std::ofstream(dir / "manifest.json") << m.dump(2);
}

// -- recorders -------------------------------------------------------------

/// What a worker (or the supervisor) sent its coordinator, in order of arrival.
struct coordinator_log {
  std::vector<batch_desc> batches;
  std::vector<std::pair<int32_t, int64_t>> exhausted;  ///< (prefetch, epoch)
  std::vector<work_item> work;
  std::vector<step_report> reports;
  std::vector<std::pair<int32_t, std::string>> down;   ///< supervisor: (drafter, why)
  std::vector<std::pair<int32_t, drafter_actor>> up;   ///< supervisor: (drafter, new incarnation)
  std::vector<std::string> escalated;                  ///< supervisor: why
  std::vector<std::string> workers_down, workers_up;   ///< supervisor: "role i: why", "role i"
  std::vector<std::string> device_lost;                ///< supervisor: why
  int vitals_asked = 0;                                ///< vitals_all requests answered
  std::string status = "{}";                           ///< what status_atom answers
  std::vector<std::string> order;  ///< "batch", "exhausted", "work", "report", "down", "up", "escalate",
                                   ///< "escalate_bad_input",
                                   ///< "device_lost"
};

/// A coordinator that only records (the worker suites' peer).  It answers
/// the requests of its interface with errors, so nothing a worker does can
/// be silently swallowed by it.
inline coordinator_actor::behavior_type recording_coordinator(coordinator_actor::pointer self,
                                                              std::shared_ptr<coordinator_log> log) {
  return {
    [](run_atom, coordinator_peers&) -> caf::result<run_summary> {
      return make_error(errc::unexpected_message, "recording coordinator: no runs");
    },
    [](stop_atom) {},
    [log](status_atom) { return log->status; },
    [](vitals_atom) {
      actor_vitals v;
      v.role = "coordinator";
      v.answered = true;
      return v;
    },
    // Its own (answered, 5 messages), drafter 0 (answers the first time
    // only: 9 messages) and drafter 1 (never answers): what the control
    // actor's tree makes of them (control_protocol_test.cpp).
    [log](vitals_all_atom, int64_t) {
      actor_vitals own;
      own.role = "coordinator";
      own.answered = true;
      own.handled = 5;
      own.last_message = "status";
      own.figures = {{"step", 3}};
      actor_vitals busy;
      busy.role = "drafter";
      busy.actor_id = 7;
      busy.answered = log->vitals_asked++ == 0;
      busy.handled = busy.answered ? 9 : 0;
      actor_vitals silent;
      silent.role = "drafter";
      silent.index = 1;
      silent.actor_id = 8;
      return std::vector<actor_vitals>{own, busy, silent};
    },
    [log](const control_command& c) {
      log->order.push_back("control " + c.action);
      return std::string("recorded");
    },
    [log](batch_desc& b) {
      log->batches.push_back(std::move(b));
      log->order.push_back("batch");
    },
    [log](exhausted_atom, int32_t i, int64_t e, int64_t) {
      log->exhausted.emplace_back(i, e);
      log->order.push_back("exhausted");
    },
    [log](work_item& w) {
      log->work.push_back(std::move(w));
      log->order.push_back("work");
    },
    [log](step_report& r) {
      log->reports.push_back(r);
      log->order.push_back("report");
    },
    [](tick_atom) {},
    [log](drafter_down_atom, int32_t d, const std::string& why) {
      log->down.emplace_back(d, why);
      log->order.push_back("down");
    },
    [log](drafter_up_atom, int32_t d, drafter_actor& h) {
      log->up.emplace_back(d, std::move(h));
      log->order.push_back("up");
    },
    [log](escalate_atom, const std::string& why) {
      log->escalated.push_back(why);
      log->order.push_back("escalate");
    },
    [log](escalate_atom, bad_input_atom, const std::string& why) {  // a worker's input cannot load
      log->escalated.push_back(why);
      log->order.push_back("escalate_bad_input");
    },
    [log](escalate_atom, int32_t, const std::string& why) {  // a drafter's restart given up
      log->escalated.push_back(why);
      log->order.push_back("escalate");
    },
    [log](escalate_atom, bad_input_atom, int32_t, const std::string& why) {  // ... for bad input
      log->escalated.push_back(why);
      log->order.push_back("escalate_bad_input");
    },
    [log](worker_down_atom, const std::string& role, int32_t i, const std::string& why) {
      log->workers_down.push_back(role + " " + std::to_string(i) + ": " + why);
      log->order.push_back("worker_down");
    },
    [log](worker_up_atom, int32_t i, target_actor&) {
      log->workers_up.push_back("target " + std::to_string(i));
      log->order.push_back("worker_up");
    },
    [log](worker_up_atom, int32_t i, prefetch_actor&) {
      log->workers_up.push_back("prefetch " + std::to_string(i));
      log->order.push_back("worker_up");
    },
    [self](shutdown_atom) { self->quit(); },
    [log](device_lost_atom, const std::string& why) {
      log->device_lost.push_back(why);
      log->order.push_back("device_lost");
    },
  };
}

/// The exit reasons of watched actors (a down_msg each).
struct exits {
  std::vector<caf::error> reasons;
  caf::actor watcher;  ///< keeps the watcher alive until its down message
};

/// Spawns an actor that monitors `who` and records its exit reason.
template <class Handle>
std::shared_ptr<exits> watch(caf::actor_system& sys, const Handle& who) {
  auto out = std::make_shared<exits>();
  out->watcher = sys.spawn([out, who](caf::event_based_actor* me) -> caf::behavior {
    me->monitor(who);
    me->set_down_handler([me, out](caf::down_msg& m) {
      out->reasons.push_back(m.reason);
      out->watcher = nullptr;
      me->quit();
    });
    return {[](caf::ok_atom) {}};
  });
  return out;
}

/// The answer to one request: a value, an error, or (still) nothing.
template <class T>
struct answer {
  std::optional<T> value;
  std::optional<caf::error> error;
  bool answered() const { return value.has_value() || error.has_value(); }
};

/// Sends `xs` to `to` as a request from a fresh event-based actor, which
/// records the reply or the error (it has an error callback: without one,
/// CAF 0.17's default error handler would kill it).  Run the scheduler,
/// then read the answer.
template <class T, class Handle, class... Ts>
std::shared_ptr<answer<T>> ask(caf::actor_system& sys, const Handle& to, Ts... xs) {
  auto out = std::make_shared<answer<T>>();
  sys.spawn([out, to, xs...](caf::event_based_actor* me) {
    me->request(to, caf::infinite, xs...)
      .then([me, out](T& v) { out->value = std::move(v); me->quit(); },
            [me, out](caf::error& e) { out->error = std::move(e); me->quit(); });
  });
  return out;
}

/// True when `err` is the Tandem error `code`.
inline bool is(const caf::error& err, errc code) {
  return err.category() == error_category && err.code() == static_cast<uint8_t>(code);
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

} // namespace tandem::test
