// The control endpoint's actor (messages/control.hpp): keeps what the
// metrics actor forwards (the last step reports, the event log, per-drafter
// figures) and answers the HTTP server's requests from it and from the
// coordinator (its status; the actions).  The JSON API it serves is
// documented in docs/control.md; every answer is JSON.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <sstream>
#include <type_traits>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "actors/default_handler.hpp"
#include "actors/metrics_lines.hpp"
#include "actors/spawn.hpp"
#include "actors/vitals.hpp"
#include "launch/run_config.hpp"
#include "messages/errors.hpp"

namespace tandem {

namespace {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

/// Step times of one drafter: counts per bucket of compute_ms, the upper
/// bounds doubling from 1 ms (the last bucket holds everything above).
struct step_histogram {
  static constexpr double first_ms = 1.0;
  static constexpr size_t buckets = 16;  ///< 1 ms .. 16 s, then +inf
  std::vector<int64_t> counts = std::vector<int64_t>(buckets + 1, 0);
  void add(double ms) {
    size_t b = 0;
    double bound = first_ms;
    while (b < buckets && ms > bound) {
      ++b;
      bound *= 2;
    }
    ++counts[b];
  }
  json to_json() const {
    json out = json::array();
    double bound = first_ms;
    for (size_t b = 0; b <= buckets; ++b, bound *= 2)
      out.push_back({{"le_ms", b < buckets ? json(bound) : json("inf")}, {"count", counts[b]}});
    return out;
  }
};

/// What the control actor knows of one drafter from the reports and events.
struct drafter_view {
  step_report last;
  bool reported = false;
  int64_t steps = 0;          ///< reports seen by this process
  int64_t incarnation = 0;    ///< restarts so far (drafter_restarted events)
  int64_t failures = 0;
  std::string last_failure;
  step_histogram step_ms;
};

/// GET /metrics: the same figures as the JSON API, as Prometheus counters,
/// gauges and histograms (prometheus-cpp's registry and text serializer).
/// Per-drafter series carry the label drafter="N"; the run's name is the
/// label run="NAME" on every series.
class prom_metrics {
 public:
  explicit prom_metrics(const std::string& run)
    : labels_{{"run", run}},
      steps_(family<prometheus::Counter>("tandem_steps_total", "Step reports received, per drafter")),
      tokens_(family<prometheus::Counter>("tandem_tokens_total", "Real (non-padding) tokens trained, per drafter")),
      scored_(family<prometheus::Counter>("tandem_scored_tokens_total", "Tokens scored by the loss, per drafter")),
      nonfinite_(family<prometheus::Counter>("tandem_nonfinite_steps_total", "Steps whose loss or gradient was not finite")),
      failures_(family<prometheus::Counter>("tandem_drafter_failures_total", "Drafter failures, per drafter")),
      restarts_(family<prometheus::Counter>("tandem_drafter_restarts_total", "Drafter restarts, per drafter")),
      events_(family<prometheus::Counter>("tandem_events_total", "Run events by kind (the event field of metrics.jsonl)")),
      loss_(family<prometheus::Gauge>("tandem_loss", "Loss of the last step, per drafter")),
      accuracy_(family<prometheus::Gauge>("tandem_accuracy", "Per-token accuracy of the last step, per drafter")),
      sim_accept_(family<prometheus::Gauge>("tandem_sim_accept",
                                            "Simulated acceptance length of the last step (not real tau)")),
      grad_norm_(family<prometheus::Gauge>("tandem_grad_norm", "Gradient norm of the last step, per drafter")),
      lr_(family<prometheus::Gauge>("tandem_learning_rate", "Learning rate of the last step, per drafter")),
      mfu_(family<prometheus::Gauge>("tandem_mfu", "Model FLOP utilisation of the last step against 989 TFLOP/s")),
      last_step_(family<prometheus::Gauge>("tandem_drafter_step", "Last step reported, per drafter")),
      tau_(family<prometheus::Gauge>("tandem_eval_tau", "Real acceptance length tau of the last evaluation")),
      memory_(family<prometheus::Gauge>("tandem_gpu_memory_bytes",
                                        "The drafter's GPU (shared by the actors on it): caching-allocator bytes "
                                        "by kind (allocated, reserved, peak)")),
      pool_(family<prometheus::Gauge>("tandem_graph_pool_bytes", "Private memory pool of the drafter's captured step")),
      run_gauges_(family<prometheus::Gauge>("tandem_run", "The coordinator's figures at the scrape (label figure)")),
      requests_(family<prometheus::Counter>("tandem_control_requests_total", "Requests to the control endpoint")),
      unauthorized_(family<prometheus::Counter>("tandem_control_unauthorized_total",
                                                "Requests refused for a missing or wrong token")),
      step_s_(family<prometheus::Histogram>("tandem_step_seconds", "Compute time of a step, per drafter")),
      wait_s_(family<prometheus::Histogram>("tandem_data_wait_seconds", "Time a drafter waited for its batch")) {}

  void step(const step_report& r) {
    const auto l = drafter(r.drafter);
    steps_.Add(l).Increment();
    tokens_.Add(l).Increment(static_cast<double>(r.real_tokens));
    scored_.Add(l).Increment(static_cast<double>(r.scored_tokens));
    if (!r.finite)
      nonfinite_.Add(l).Increment();
    loss_.Add(l).Set(r.loss);
    accuracy_.Add(l).Set(r.accuracy);
    sim_accept_.Add(l).Set(r.sim_accept);
    grad_norm_.Add(l).Set(r.grad_norm);
    lr_.Add(l).Set(r.lr);
    mfu_.Add(l).Set(r.compute_ms > 0 ? r.tflop / (r.compute_ms / 1e3) / 989.0 : 0.0);
    last_step_.Add(l).Set(static_cast<double>(r.step));
    if (r.mem_reserved > 0) {
      memory_.Add(with("kind", "allocated", "drafter", std::to_string(r.drafter))).Set(static_cast<double>(r.mem_allocated));
      memory_.Add(with("kind", "reserved", "drafter", std::to_string(r.drafter))).Set(static_cast<double>(r.mem_reserved));
      memory_.Add(with("kind", "peak", "drafter", std::to_string(r.drafter))).Set(static_cast<double>(r.mem_peak));
      pool_.Add(l).Set(static_cast<double>(r.graph_pool_bytes));
    }
    step_s_.Add(l, bounds()).Observe(r.compute_ms / 1e3);
    wait_s_.Add(l, bounds()).Observe(r.wait_ms / 1e3);
  }
  void event(const run_event& e, const std::string& kind) {
    events_.Add(with("event", kind)).Increment();
    if (const auto* x = caf::get_if<drafter_failed_event>(&e))
      failures_.Add(drafter(x->drafter)).Increment();
    if (const auto* x = caf::get_if<drafter_restarted_event>(&e))
      restarts_.Add(drafter(x->drafter)).Increment();
    if (const auto* x = caf::get_if<eval_event>(&e); x && x->error.empty())
      tau_.Add(labels_).Set(x->tau);
  }
  void request() { requests_.Add(labels_).Increment(); }
  void unauthorized() { unauthorized_.Add(labels_).Increment(); }

  /// The text exposition, with the coordinator's status as tandem_run{figure=...}.
  std::string text(const json& status) {
    for (const char* k : {"step", "epoch", "in_flight", "queued", "credits", "durable_step"})
      if (status.contains(k) && status[k].is_number())
        run_gauges_.Add(with("figure", k)).Set(status[k].get<double>());
    run_gauges_.Add(with("figure", "paused")).Set(status.value("paused", false) ? 1 : 0);
    if (status.contains("ledger") && status["ledger"].is_object())
      for (const auto& [k, v] : status["ledger"].items())
        if (v.is_number())
          run_gauges_.Add(with("figure", "samples_" + k)).Set(v.get<double>());
    return prometheus::TextSerializer().Serialize(registry_->Collect());
  }

 private:
  template <class M>
  prometheus::Family<M>& family(const std::string& name, const std::string& help) {
    if constexpr (std::is_same_v<M, prometheus::Counter>)
      return prometheus::BuildCounter().Name(name).Help(help).Register(*registry_);
    else if constexpr (std::is_same_v<M, prometheus::Gauge>)
      return prometheus::BuildGauge().Name(name).Help(help).Register(*registry_);
    else
      return prometheus::BuildHistogram().Name(name).Help(help).Register(*registry_);
  }
  prometheus::Labels with(const std::string& k, const std::string& v) const {
    auto l = labels_;
    l[k] = v;
    return l;
  }
  prometheus::Labels drafter(int32_t d) const { return with("drafter", std::to_string(d)); }
  prometheus::Labels with(const std::string& k1, const std::string& v1, const std::string& k2,
                          const std::string& v2) const {
    auto l = with(k1, v1);
    l[k2] = v2;
    return l;
  }
  /// Seconds, doubling from 1 ms to ~16 s (the JSON histogram's buckets).
  static prometheus::Histogram::BucketBoundaries bounds() {
    prometheus::Histogram::BucketBoundaries b;
    for (double v = 1e-3; v < 20; v *= 2)
      b.push_back(v);
    return b;
  }

  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  prometheus::Labels labels_;
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Family<prometheus::Counter>& tokens_;
  prometheus::Family<prometheus::Counter>& scored_;
  prometheus::Family<prometheus::Counter>& nonfinite_;
  prometheus::Family<prometheus::Counter>& failures_;
  prometheus::Family<prometheus::Counter>& restarts_;
  prometheus::Family<prometheus::Counter>& events_;
  prometheus::Family<prometheus::Gauge>& loss_;
  prometheus::Family<prometheus::Gauge>& accuracy_;
  prometheus::Family<prometheus::Gauge>& sim_accept_;
  prometheus::Family<prometheus::Gauge>& grad_norm_;
  prometheus::Family<prometheus::Gauge>& lr_;
  prometheus::Family<prometheus::Gauge>& mfu_;
  prometheus::Family<prometheus::Gauge>& last_step_;
  prometheus::Family<prometheus::Gauge>& tau_;
  prometheus::Family<prometheus::Gauge>& memory_;
  prometheus::Family<prometheus::Gauge>& pool_;
  prometheus::Family<prometheus::Gauge>& run_gauges_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Counter>& unauthorized_;
  prometheus::Family<prometheus::Histogram>& step_s_;
  prometheus::Family<prometheus::Histogram>& wait_s_;
};

struct control_state {
  static inline const char* name = "tandem.control";
  control_options opts;
  coordinator_actor coordinator;
  clock_type::time_point start = clock_type::now();
  std::deque<step_report> steps;                   ///< the last opts.steps_kept
  std::deque<double> arrived;                      ///< uptime() when each of `steps` came
  int64_t reports = 0;                             ///< step reports received (the last one's sequence number)
  std::deque<std::pair<int64_t, json>> events;     ///< (sequence number, line), the last opts.events_kept
  int64_t next_event = 1;
  std::map<int32_t, drafter_view> drafters;
  int64_t requests = 0;
  int64_t unauthorized = 0;
  std::unique_ptr<prom_metrics> prom;  ///< made with the run's name at spawn
  std::string last_unauthorized;
  std::shared_ptr<vitals_meter> meter;  ///< this actor's own vitals
  /// Per drafter, from its last answered vitals: which incarnation, whether
  /// it captures its step as a graph and how many it has (a stepping drafter
  /// with none yet is "capturing"; it does not answer while it captures).
  struct capture_seen {
    uint64_t actor_id = 0;
    bool captures = false;
    double captured = 0;
  };
  std::map<int32_t, capture_seen> capture;
  /// Each actor's last answered vitals (by CAF id) and when it came.
  std::map<uint64_t, std::pair<actor_vitals, clock_type::time_point>> known_vitals;
  std::vector<actor_vitals> last_vitals;  ///< the last gathering, whole
  bool gathering = false;                 ///< a background gathering is under way
  double uptime() const { return std::chrono::duration<double>(clock_type::now() - start).count(); }
};

using self_ptr = control_actor::stateful_pointer<control_state>;

control_reply reply(int32_t status, const json& body) {
  // Text from the request (a path, a method) need not be UTF-8: replaced,
  // never a throw that would end this actor.
  return {status, body.dump(-1, ' ', false, json::error_handler_t::replace)};
}

control_reply error_reply(int32_t status, const std::string& what) {
  return reply(status, {{"error", what}});
}

void add_event(control_state& s, json line) {
  line["seq"] = s.next_event;
  line["uptime_s"] = s.uptime();
  s.events.emplace_back(s.next_event++, std::move(line));
  while (s.events.size() > s.opts.events_kept)
    s.events.pop_front();
}

json report_json(const step_report& r) {
  return {{"drafter", r.drafter},       {"step", r.step},           {"batch", r.batch_id},
          {"loss", r.loss},             {"accuracy", r.accuracy},   {"sim_accept", r.sim_accept},
          {"grad_norm", r.grad_norm},   {"lr", r.lr},               {"tokens", r.real_tokens},
          {"scored_tokens", r.scored_tokens}, {"finite", r.finite}, {"compute_ms", r.compute_ms},
          {"wait_ms", r.wait_ms},       {"tflop", r.tflop}};
}

/// "/v1/steps?n=20" → path "/v1/steps", query {"n": "20"}.
struct target_parts {
  std::string path;
  std::map<std::string, std::string> query;
};

target_parts split_target(const std::string& target) {
  target_parts t;
  const auto q = target.find('?');
  t.path = target.substr(0, q);
  if (q == std::string::npos)
    return t;
  std::string rest = target.substr(q + 1);
  size_t i = 0;
  while (i <= rest.size()) {
    auto j = rest.find('&', i);
    if (j == std::string::npos)
      j = rest.size();
    const auto kv = rest.substr(i, j - i);
    const auto eq = kv.find('=');
    if (!kv.empty())
      t.query[kv.substr(0, eq)] = eq == std::string::npos ? "" : kv.substr(eq + 1);
    i = j + 1;
  }
  while (t.path.size() > 1 && t.path.back() == '/')
    t.path.pop_back();
  return t;
}

/// A non-negative integer query parameter (`fallback` when absent); nullopt
/// when present but not a number.
std::optional<int64_t> query_int(const target_parts& t, const std::string& key, int64_t fallback) {
  auto it = t.query.find(key);
  if (it == t.query.end())
    return fallback;
  const auto& v = it->second;
  if (v.empty() || v.size() > 12 || v.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::stoll(v);
}

/// The endpoints: GET /v1 lists them.
const std::vector<std::pair<std::string, std::string>> endpoints = {
  {"GET /v1", "this list"},
  {"GET /v1/status", "the run: step, epoch, paused, ledger, credits, queues, the drafters' states"},
  {"GET /v1/tree", "every actor: role, index, device (and node, in a cluster), state, incarnation, thread, uptime, messages handled, last message, its role's figures"},
  {"GET /v1/actors/ROLE/INDEX", "one actor in detail (a drafter: last report, step-time histogram)"},
  {"GET /v1/ledger", "epoch, samples pending / issued / trained / committed, durable checkpoint, each prefetch's cursor"},
  {"GET /v1/steps?n=N", "the last N step reports (default 20)"},
  {"GET /v1/events?since=SEQ", "the events after sequence number SEQ (default 0: all kept)"},
  {"GET /v1/config", "the effective config (TOML)"},
  {"GET /metrics", "the same figures as Prometheus text (counters, gauges, histograms)"},
  {"GET /v1/dashboard?steps_after=N&events_after=M", "the dashboard's frame: status, tree, the newer reports and events"},
  {"GET /", "the web dashboard (GET /?token=TOKEN once: a cookie, then the page)"},
  {"POST /v1/pause", "stop sending work to the drafters (the steps in progress finish)"},
  {"POST /v1/resume", "send work again"},
  {"POST /v1/checkpoint", "write a checkpoint now (after the step in progress)"},
  {"POST /v1/stop", "as SIGTERM: finish the step, write a checkpoint, end"},
  {"POST /v1/fault", "{\"drafter\": N, \"kind\": K, \"at_step\": S}: inject fault K into drafter N (at step S; default its next)"},
  {"POST /v1/lr_scale", "{\"value\": X, \"at_step\": S}: the learning rate times X from step S on (default the next not yet sent)"},
  {"POST /v1/log_every", "{\"value\": N}: a metrics.jsonl step line every N steps"},
};

/// The effective config now: `toml` (the run's at its start, to_toml's
/// lines) with the values set through this endpoint since then in place of
/// their first ones, marked: train.log_every, as the coordinator's status
/// has it.  (The learning-rate multiplier is no config key: status shows it.)
std::string config_now(const std::string& toml, const json& status) {
  if (!status.contains("log_every") || !status["log_every"].is_number_integer())
    return toml;
  const auto now = std::to_string(status["log_every"].get<int64_t>());
  std::istringstream in(toml);
  std::string out, section, line;
  while (std::getline(in, line)) {
    if (line.rfind('[', 0) == 0)
      section = line.substr(1, line.find(']') - 1);
    const std::string key = "log_every = ";
    if (section == "train" && line.rfind(key, 0) == 0 && line.substr(key.size()) != now)
      line = key + now + "  # set while running (at the start: " + line.substr(key.size()) + ")";
    out += line + "\n";
  }
  return out;
}

/// Why ROLE INDEX is not an actor of the run, naming what it has: "no
/// drafter 7: drafter indices are 0..1", "no role 'drafer': the roles are
/// coordinator, drafter, ...".
std::string missing_actor(const std::vector<control_options::actor_entry>& actors, const std::string& role,
                          int64_t index) {
  std::set<std::string> roles;
  std::set<int32_t> indices;
  for (const auto& a : actors) {
    roles.insert(a.role);
    if (a.role == role)
      indices.insert(a.index);
  }
  const std::string tail = " (GET /v1/tree lists the actors)";
  if (indices.empty()) {
    std::string all;
    for (const auto& r : roles)
      all += (all.empty() ? "" : ", ") + r;
    return "no role '" + role + "': the roles are " + all + tail;
  }
  std::string have;
  if (indices.size() == 1)
    have = "the only " + role + " is " + std::to_string(*indices.begin());
  else if (*indices.begin() == 0 && *indices.rbegin() == static_cast<int32_t>(indices.size()) - 1)
    have = role + " indices are 0.." + std::to_string(*indices.rbegin());
  else
    for (const auto i : indices)
      have += (have.empty() ? role + " indices are " : ", ") + std::to_string(i);
  return "no " + role + " " + std::to_string(index) + ": " + have + tail;
}

/// Memory per GPU: the newest report of a drafter on it (every actor on one
/// device shares its caching allocator, so one reading covers the device).
json devices_json(const control_state& s) {
  std::map<std::string, const drafter_view*> newest;
  for (const auto& a : s.opts.actors) {
    if (a.role != "drafter" || a.device.rfind("cuda", 0) != 0)
      continue;
    auto it = s.drafters.find(a.index);
    if (it == s.drafters.end() || !it->second.reported)
      continue;
    auto& slot = newest[a.device];
    if (!slot || it->second.last.step > slot->last.step)
      slot = &it->second;
  }
  json out = json::array();
  for (const auto& [device, v] : newest)
    out.push_back({{"device", device},
                   {"allocated_bytes", v->last.mem_allocated},
                   {"reserved_bytes", v->last.mem_reserved},
                   {"peak_bytes", v->last.mem_peak},
                   {"reported_by", "drafter " + std::to_string(v->last.drafter)},
                   {"at_step", v->last.step}});
  return out;
}

/// How long the coordinator waits for each actor's vitals: a GPU actor
/// answers between its steps.
int64_t vitals_wait_ms(const control_state& s) {
  return std::clamp<int64_t>(s.opts.answer_timeout_ms / 4, 1, 500);
}

/// One actor's vitals (messages/vitals.hpp) as fields of its tree entry.
/// An actor that does not answer in time (a checkpointer writing, a GPU
/// actor in a long message) shows its last answer, kept per incarnation,
/// with its age.
void add_vitals(const control_state& s, json& e, const actor_vitals& answer) {
  e["actor_id"] = answer.actor_id;
  e["answered"] = answer.answered;
  const actor_vitals* shown = &answer;
  if (answer.answered) {
    // shown as it is
  } else if (answer.down) {
    e["vitals"] = "down: the actor has ended";
    if (e.value("state", "") != "restarting")  // a drafter's restart says more
      e["state"] = "down";
    return;
  } else {
    auto why = "no answer within " + std::to_string(vitals_wait_ms(s)) + " ms (busy or stuck)";
    auto it = s.known_vitals.find(answer.actor_id);
    if (it == s.known_vitals.end()) {
      e["vitals"] = std::move(why);
      return;
    }
    const auto age = std::chrono::duration<double>(clock_type::now() - it->second.second).count();
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", age);
    e["vitals"] = why + "; its answer of " + buf + " s ago";
    e["vitals_age_s"] = age;
    shown = &it->second.first;
  }
  const auto& v = *shown;
  e["thread"] = v.thread;
  e["thread_name"] = v.thread_name;
  e["own_thread"] = v.own_thread;
  e["uptime_s"] = v.uptime_s;
  e["messages_handled"] = v.handled;
  e["last_message"] = v.last_message;
  e["last_message_age_s"] = v.last_message_age_s;
  e["busiest_ms"] = v.busiest_ms;
  json figures = json::object();
  for (const auto& f : v.figures)
    figures[f.name] = f.value;
  e["figures"] = std::move(figures);
}

/// The actor tree from the plan's entries, the coordinator's status and
/// the actors' vitals (an actor the plan does not list, the host
/// checkpointer, is added after them).
json tree_json(control_state& s, const json& status, const std::vector<actor_vitals>& vitals) {
  std::vector<bool> placed(vitals.size(), false);
  json actors = json::array();
  std::map<int32_t, json> coord_drafters;
  if (status.contains("drafters"))
    for (const auto& d : status["drafters"])
      coord_drafters[d.value("index", -1)] = d;
  for (const auto& a : s.opts.actors) {
    json e{{"role", a.role}, {"index", a.index}, {"device", a.device}, {"name", a.role + " " + std::to_string(a.index)}};
    if (!a.node.empty())
      e["node"] = a.node;  // a cluster run: the member holding it
    if (a.role == "drafter") {
      const auto& v = s.drafters[a.index];
      auto it = coord_drafters.find(a.index);
      e["state"] = it != coord_drafters.end() ? it->second.value("state", "unknown") : "unknown";
      e["incarnation"] = v.incarnation;
      e["steps_handled"] = v.steps;
      if (v.reported) {
        e["last_step"] = v.last.step;
        e["gpu_memory_allocated"] = v.last.mem_allocated;
        e["graphs"] = v.last.graphs;
      }
      e["failures"] = v.failures;
    } else if (a.role == "coordinator") {
      e["state"] = status.value("paused", false) ? "paused" : status.value("stopping", false) ? "stopping" : "running";
      e["step"] = status.value("step", int64_t{0});
    } else if (a.role == "control") {
      e["state"] = "serving";
      e["requests"] = s.requests;
    } else {
      e["state"] = status.value("stopping", false) ? "stopping" : "running";
    }
    for (size_t i = 0; i < vitals.size(); ++i)
      if (!placed[i] && vitals[i].role == a.role && vitals[i].index == a.index) {
        const auto& v = vitals[i];
        add_vitals(s, e, v);
        placed[i] = true;
        if (a.role == "drafter") {
          auto seen = s.capture.find(a.index);
          if (e["state"] == "stepping" && seen != s.capture.end() && seen->second.actor_id == v.actor_id
              && seen->second.captures && seen->second.captured == 0)
            e["state"] = "capturing";
        }
        break;
      }
    actors.push_back(std::move(e));
  }
  for (size_t i = 0; i < vitals.size(); ++i)
    if (!placed[i]) {
      const auto& v = vitals[i];
      json e{{"role", v.role}, {"index", v.index}, {"device", "cpu"},
             {"name", v.role + " " + std::to_string(v.index)},
             {"state", status.value("stopping", false) ? "stopping" : "running"}};
      add_vitals(s, e, v);
      actors.push_back(std::move(e));
    }
  return {{"run", s.opts.run_name}, {"uptime_s", s.uptime()}, {"actors", std::move(actors)},
          {"devices", devices_json(s)}};
}

/// Keeps a gathering of every actor's vitals (the coordinator's answer and
/// this actor's own): the last answer of each incarnation, shown for it
/// while it does not answer; whether each drafter captures graphs and has
/// one yet; the whole list, which the dashboard's frames show.
void remember_vitals(control_state& s, const std::vector<actor_vitals>& all) {
  const auto now = clock_type::now();
  for (const auto& v : all) {
    if (!v.answered)
      continue;
    s.known_vitals[v.actor_id] = {v, now};
    if (v.role == "drafter") {
      auto& seen = s.capture[v.index];
      seen = {v.actor_id, false, 0};
      for (const auto& f : v.figures) {
        if (f.name == "capture_graphs")
          seen.captures = f.value > 0;
        if (f.name == "captured_graphs")
          seen.captured = f.value;
      }
    }
  }
  // Forget the answers of incarnations that are gone (a restarted drafter's).
  for (auto it = s.known_vitals.begin(); it != s.known_vitals.end();)
    it = std::any_of(all.begin(), all.end(), [&](const actor_vitals& v) { return v.actor_id == it->first; })
           ? std::next(it) : s.known_vitals.erase(it);
  s.last_vitals = all;
}

/// What an answer needs besides the coordinator's status: nothing; every
/// actor's vitals now (a round trip to each, up to vitals_wait_ms); or the
/// last ones gathered, with a new gathering started for the next answer
/// (the dashboard's frames: they come every second and must not wait).
enum class gather { status, vitals, last_vitals };

/// Gathers every actor's vitals into the control state, then calls
/// `then(all)` (all empty: the coordinator did not answer).
template <class Then>
void gather_vitals(self_ptr self, Then then) {
  self->request(self->state.coordinator, std::chrono::milliseconds(self->state.opts.answer_timeout_ms),
                vitals_all_atom::value, vitals_wait_ms(self->state))
    .then(
      [self, then](std::vector<actor_vitals>& all) mutable {
        all.push_back(self->state.meter->report(self->id()));
        remember_vitals(self->state, all);
        then(all);
      },
      [self, then](const caf::error&) mutable {
        // The run is ending: this actor's own only.
        std::vector<actor_vitals> own{self->state.meter->report(self->id())};
        remember_vitals(self->state, own);
        then(own);
      });
}

/// Asks the coordinator for its status (and what `what` says of every
/// actor's vitals) and answers with `make(state, status, vitals)`.
template <class Make>
caf::result<control_reply> with_status(self_ptr self, Make make, gather what = gather::status) {
  auto rp = self->make_response_promise<control_reply>();
  const auto wait = std::chrono::milliseconds(self->state.opts.answer_timeout_ms);
  self->request(self->state.coordinator, wait, status_atom::value)
    .then(
      [self, rp, make, what](const std::string& text) mutable {
        auto parsed = json::parse(text, nullptr, false);
        auto status = parsed.is_discarded() ? json::object() : parsed;
        switch (what) {
          case gather::status:
            rp.deliver(make(self->state, status, std::vector<actor_vitals>{}));
            return;
          case gather::vitals:
            gather_vitals(self, [self, rp, make, status](const std::vector<actor_vitals>& all) mutable {
              rp.deliver(make(self->state, status, all));
            });
            return;
          case gather::last_vitals:
            rp.deliver(make(self->state, status, self->state.last_vitals));
            if (!self->state.gathering) {
              self->state.gathering = true;
              gather_vitals(self, [self](const std::vector<actor_vitals>&) { self->state.gathering = false; });
            }
            return;
        }
      },
      [self, rp](const caf::error& err) mutable {
        rp.deliver(error_reply(503, "the coordinator did not answer: " + self->system().render(err)));
      });
  return rp;
}

/// A field of an action's body: absent → `fallback`; nullopt (with `why`
/// set) when present but not what it must be.
std::optional<int64_t> body_int(const json& body, const char* key, int64_t fallback, int64_t min,
                                std::string& why) {
  if (!body.contains(key))
    return fallback;
  const auto& v = body[key];
  if (!v.is_number_integer() || v.get<int64_t>() < min) {
    why = std::string("\"") + key + "\" must be an integer >= " + std::to_string(min);
    return std::nullopt;
  }
  return v.get<int64_t>();
}

caf::result<control_reply> on_action(self_ptr self, const std::string& action, const control_request& req) {
  json body = json::object();
  if (!req.body.empty()) {
    body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object())
      return error_reply(400, "the body of POST /v1/" + action + " must be a JSON object (or empty)");
  }
  control_command cmd{action, req.source};
  std::string why;
  const auto usage = [&](const std::string& what) { return error_reply(400, "POST /v1/" + action + ": " + what); };
  if (action == "fault") {
    // {"drafter": N, "kind": K, "at_step": S (optional: its next step)}
    if (!body.contains("drafter") || !body.contains("kind"))
      return usage("the body needs \"drafter\" and \"kind\", e.g. {\"drafter\": 0, \"kind\": \"throw\", \"at_step\": 120}");
    const auto d = body_int(body, "drafter", 0, 0, why);
    const auto at = body_int(body, "at_step", 0, 0, why);
    if (!d || !at)
      return usage(why);
    if (!body["kind"].is_string()
        || std::find(fault_kinds().begin(), fault_kinds().end(), body["kind"].get<std::string>())
             == fault_kinds().end()) {
      std::string kinds;
      for (const auto& k : fault_kinds())
        kinds += (kinds.empty() ? "" : ", ") + k;
      return usage("\"kind\" must be one of " + kinds);
    }
    const auto& actors = self->state.opts.actors;
    const auto drafter = std::find_if(actors.begin(), actors.end(),
                                      [&](const auto& a) { return a.role == "drafter" && a.index == *d; });
    if (drafter == actors.end())
      return error_reply(404, missing_actor(actors, "drafter", *d));
    cmd.drafter = static_cast<int32_t>(*d);
    cmd.kind = body["kind"].get<std::string>();
    // As [[faults.inject]] (launch/plan.cpp): a CUDA fault needs a CUDA device.
    if (cmd.kind.rfind("cuda_", 0) == 0 && drafter->device.rfind("cuda", 0) != 0)
      return usage("kind " + cmd.kind + " needs a drafter on a CUDA device (drafter " + std::to_string(*d) + " is on "
                   + drafter->device + ")");
    cmd.at_step = *at;
  } else if (action == "lr_scale" || action == "log_every") {
    // {"value": X, "at_step": S (lr_scale only, optional: the first step not yet sent)}
    if (!body.contains("value") || !body["value"].is_number())
      return usage("the body needs a number \"value\", e.g. {\"value\": 0.5}");
    cmd.value = body["value"].get<double>();
    if (action == "lr_scale") {
      const auto at = body_int(body, "at_step", 0, 1, why);
      if (!at)
        return usage(why);
      cmd.at_step = *at;
      if (!(cmd.value > 0) || !std::isfinite(cmd.value) || cmd.value > 1e6)
        return usage("\"value\" must be a positive multiplier of the scheduled learning rate, at most 1e6");
    } else if (!body["value"].is_number_integer() || cmd.value < 1) {
      return usage("\"value\" must be a positive integer (steps between metrics lines)");
    }
  }
  auto rp = self->make_response_promise<control_reply>();
  self->request(self->state.coordinator, std::chrono::milliseconds(self->state.opts.answer_timeout_ms),
                std::move(cmd))
    .then([rp](const std::string& result) mutable { rp.deliver(reply(200, {{"result", result}})); },
          [self, rp](const caf::error& err) mutable {
            // A refused action (the run is stopping) is a conflict, not our fault.
            rp.deliver(error_reply(err.category() == error_category ? 409 : 503, self->system().render(err)));
          });
  return rp;
}

caf::result<control_reply> on_request(self_ptr self, const control_request& req) {
  auto& s = self->state;
  ++s.requests;
  s.prom->request();
  const auto t = split_target(req.target);
  const bool get = req.method == "GET";
  const bool post = req.method == "POST";
  auto wrong_method = [&](const char* allowed) {
    return error_reply(405, req.method + " " + t.path + ": not allowed (" + allowed + ")");
  };
  if (t.path == "/metrics") {
    if (!get)
      return wrong_method("GET");
    return with_status(self, [](control_state& s, const json& status, const std::vector<actor_vitals>&) {
      return control_reply{200, s.prom->text(status), "text/plain; version=0.0.4; charset=utf-8"};
    });
  }
  if (t.path == "/v1") {
    if (!get)
      return wrong_method("GET");
    json list = json::array();
    for (const auto& [e, doc] : endpoints)
      list.push_back({{"endpoint", e}, {"what", doc}});
    return reply(200, {{"api", "v1"}, {"endpoints", list}});
  }
  if (t.path == "/v1/status") {
    if (!get)
      return wrong_method("GET");
    return with_status(self, [](control_state& s, const json& status, const std::vector<actor_vitals>&) {
      return reply(200, {{"run", s.opts.run_name}, {"uptime_s", s.uptime()}, {"requests", s.requests},
                         {"unauthorized", s.unauthorized}, {"coordinator", status}});
    });
  }
  if (t.path == "/v1/tree") {
    if (!get)
      return wrong_method("GET");
    return with_status(
      self,
      [](control_state& s, const json& status, const std::vector<actor_vitals>& vitals) {
        return reply(200, tree_json(s, status, vitals));
      },
      gather::vitals);
  }
  if (t.path == "/v1/ledger") {
    if (!get)
      return wrong_method("GET");
    return with_status(self, [](control_state&, const json& status, const std::vector<actor_vitals>& vitals) {
      json out{{"epoch", status.value("epoch", int64_t{0})},
               {"step", status.value("step", int64_t{0})},
               {"in_flight", status.value("in_flight", int64_t{0})},
               {"queued", status.value("queued", int64_t{0})},
               {"credits_per_prefetch", status.value("credits", int64_t{0})},
               {"durable_step", status.value("durable_step", int64_t{-1})},
               {"checkpoint", status.value("checkpoint", std::string())}};
      if (status.contains("ledger"))
        out["samples"] = status["ledger"];
      // Each prefetch actor's cursor in its share of the epoch.
      out["prefetch"] = json::array();
      for (const auto& v : vitals) {
        if (v.role != "prefetch")
          continue;
        json c{{"index", v.index}, {"answered", v.answered}};
        for (const auto& f : v.figures)
          if (f.name == "epoch" || f.name == "epoch_samples" || f.name == "epoch_sent" || f.name == "reissued"
              || f.name == "credit")
            c[f.name] = static_cast<int64_t>(f.value);
        out["prefetch"].push_back(std::move(c));
      }
      return reply(200, out);
    }, gather::vitals);
  }
  if (t.path == "/v1/steps") {
    if (!get)
      return wrong_method("GET");
    const auto n = query_int(t, "n", 20);
    if (!n)
      return error_reply(400, "n must be a non-negative integer");
    json out = json::array();
    const auto first = s.steps.size() > static_cast<size_t>(*n) ? s.steps.size() - static_cast<size_t>(*n) : 0;
    const double now = s.uptime();
    for (size_t i = first; i < s.steps.size(); ++i) {
      auto r = report_json(s.steps[i]);
      r["age_s"] = now - s.arrived[i];  // a drafter that stopped stepping shows in the age of its last
      out.push_back(std::move(r));
    }
    return reply(200, {{"steps", out}});
  }
  if (t.path == "/v1/events") {
    if (!get)
      return wrong_method("GET");
    const auto since = query_int(t, "since", 0);
    if (!since)
      return error_reply(400, "since must be a non-negative integer");
    json out = json::array();
    for (const auto& [seq, line] : s.events)
      if (seq > *since)
        out.push_back(line);
    return reply(200, {{"events", out}, {"next", s.next_event - 1}});
  }
  if (t.path == "/v1/dashboard") {
    // The dashboard's WebSocket frame: what is new since the client's last.
    if (!get)
      return wrong_method("GET");
    const auto steps_after = query_int(t, "steps_after", 0);
    const auto events_after = query_int(t, "events_after", 0);
    if (!steps_after || !events_after)
      return error_reply(400, "steps_after and events_after must be non-negative integers");
    return with_status(self, [sa = *steps_after, ea = *events_after](control_state& s, const json& status,
                                                                      const std::vector<actor_vitals>& vitals) {
      json steps = json::array();
      const auto first_seq = s.reports - static_cast<int64_t>(s.steps.size()) + 1;
      for (size_t i = 0; i < s.steps.size(); ++i)
        if (first_seq + static_cast<int64_t>(i) > sa)
          steps.push_back(report_json(s.steps[i]));
      json events = json::array();
      for (const auto& [seq, line] : s.events)
        if (seq > ea)
          events.push_back(line);
      return reply(200, {{"run", s.opts.run_name},        {"uptime_s", s.uptime()},
                         {"coordinator", status},         {"tree", tree_json(s, status, vitals)["actors"]},
                         {"steps", steps},                {"steps_seq", s.reports},
                         {"events", events},              {"next_event", s.next_event - 1}});
    }, gather::last_vitals);
  }
  if (t.path == "/v1/config") {
    if (!get)
      return wrong_method("GET");
    // The values set while running come from the coordinator's status; one
    // that does not answer still leaves the start config to read.
    auto rp = self->make_response_promise<control_reply>();
    self->request(s.coordinator, std::chrono::milliseconds(s.opts.answer_timeout_ms), status_atom::value)
      .then(
        [self, rp](const std::string& text) mutable {
          auto status = json::parse(text, nullptr, false);
          rp.deliver(reply(200, {{"toml", config_now(self->state.opts.config_toml,
                                                     status.is_discarded() ? json::object() : status)}}));
        },
        [self, rp](const caf::error& err) mutable {
          rp.deliver(reply(200, {{"toml", self->state.opts.config_toml},
                                 {"note", "the coordinator did not answer (" + self->system().render(err)
                                            + "): values set while running are not shown"}}));
        });
    return rp;
  }
  if (t.path.rfind("/v1/actors/", 0) == 0) {
    if (!get)
      return wrong_method("GET");
    const auto rest = t.path.substr(11);
    const auto slash = rest.find('/');
    const auto role = rest.substr(0, slash);
    const auto index_text = slash == std::string::npos ? std::string("0") : rest.substr(slash + 1);
    const auto digits = index_text.substr(index_text.rfind('-', 0) == 0 ? 1 : 0);
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos)
      return error_reply(400, "'" + index_text + "' is not an actor index: an actor is /v1/actors/ROLE/INDEX, INDEX a "
                                "whole number (e.g. /v1/actors/drafter/0)");
    const auto index = static_cast<int32_t>(std::stoi(index_text));
    const auto it = std::find_if(s.opts.actors.begin(), s.opts.actors.end(),
                                 [&](const auto& a) { return a.role == role && a.index == index; });
    if (it == s.opts.actors.end())
      return error_reply(404, missing_actor(s.opts.actors, role, index));
    return with_status(self, [role, index](control_state& s, const json& status,
                                           const std::vector<actor_vitals>& vitals) {
      auto tree = tree_json(s, status, vitals);
      json out;
      for (const auto& a : tree["actors"])
        if (a["role"] == role && a["index"] == index)
          out = a;
      if (role == "drafter") {
        const auto& v = s.drafters[index];
        if (v.reported)
          out["last_report"] = report_json(v.last);
        out["step_ms_histogram"] = v.step_ms.to_json();
        out["last_failure"] = v.last_failure;
        if (v.reported) {
          out["memory"] = {{"allocated_bytes", v.last.mem_allocated},
                           {"reserved_bytes", v.last.mem_reserved},
                           {"peak_bytes", v.last.mem_peak}};
          out["captured_graphs"] = json::array();
          if (v.last.graphs > 0)
            out["captured_graphs"].push_back({{"graph", "step"}, {"pool_bytes", v.last.graph_pool_bytes}});
        }
      }
      return reply(200, out);
    }, gather::vitals);
  }
  for (const char* action : {"pause", "resume", "checkpoint", "stop", "fault", "lr_scale", "log_every"})
    if (t.path == std::string("/v1/") + action)
      return post ? on_action(self, action, req) : wrong_method("POST");
  return error_reply(404, "no endpoint " + t.path + " (GET /v1 lists them)");
}

} // namespace

control_actor spawn_control(caf::actor_system& sys, control_options opts, coordinator_actor coordinator) {
  auto behavior = [](self_ptr self, control_options o, coordinator_actor c) -> control_actor::behavior_type {
    install_default_handler(self, control_state::name);
    self->state.opts = std::move(o);
    self->state.coordinator = std::move(c);
    self->state.prom = std::make_unique<prom_metrics>(self->state.opts.run_name);
    auto meter = std::make_shared<vitals_meter>(self->system(), "control", 0, false);
    meter->figures = [self] {
      return std::vector<vitals_figure>{{"requests", static_cast<double>(self->state.requests)},
                                        {"unauthorized", static_cast<double>(self->state.unauthorized)}};
    };
    self->state.meter = meter;
    return counted(meter, control_actor::behavior_type{
      vitals_handler(self, meter),
      [self](const control_request& req) { return on_request(self, req); },
      [self](const step_report& r) {
        auto& s = self->state;
        s.steps.push_back(r);
        s.arrived.push_back(s.uptime());
        ++s.reports;
        while (s.steps.size() > s.opts.steps_kept) {
          s.steps.pop_front();
          s.arrived.pop_front();
        }
        auto& v = s.drafters[r.drafter];
        v.last = r;
        v.reported = true;
        ++v.steps;
        v.step_ms.add(r.compute_ms);
        s.prom->step(r);
      },
      [self](const run_event& e) {
        auto& s = self->state;
        if (const auto* x = caf::get_if<drafter_restarted_event>(&e))
          ++s.drafters[x->drafter].incarnation;
        if (const auto* x = caf::get_if<drafter_failed_event>(&e)) {
          auto& v = s.drafters[x->drafter];
          ++v.failures;
          v.last_failure = x->reason;
        }
        auto line = event_line(e);
        s.prom->event(e, line.value("event", "unknown"));
        add_event(s, std::move(line));
      },
      [self](unauthorized_atom, const std::string& who) {
        ++self->state.unauthorized;
        self->state.prom->unauthorized();
        self->state.last_unauthorized = who;
      },
      [self](shutdown_atom) { self->quit(); },
    });
  };
  return sys.spawn(behavior, std::move(opts), std::move(coordinator));
}

} // namespace tandem
