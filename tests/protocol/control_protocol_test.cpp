// Control protocol (messages/control.hpp): the real control actor of
// actors/control.cpp on CAF's deterministic test coordinator, fed by the
// real metrics actor, with a recording coordinator (support.hpp) whose
// status is "{}" (or what a test sets in its log) and which answers every
// control_command "recorded".  The
// coordinator's own side of the actions is in coordinator_protocol_test.cpp.
#define CAF_SUITE control_protocol

#include "actors/spawn.hpp"  // before dsl.hpp (its `inject` macro)
#include "support.hpp"

#include "dsl.hpp"

using namespace tandem;
using namespace tandem::test;

namespace {

struct fixture : test_coordinator_fixture<config> {
  std::shared_ptr<coordinator_log> log = std::make_shared<coordinator_log>();
  coordinator_actor coord = sys.spawn(recording_coordinator, log);
  control_actor control;
  metrics_actor metrics;

  fixture() {
    control_options o;
    o.run_name = "proto";
    o.config_toml = "[train]\nmax_steps = 7\nlog_every = 10\n[other]\nlog_every = 10\n";
    o.actors = {{"coordinator", 0, "cpu"}, {"drafter", 0, "cuda:0"}, {"drafter", 1, "cuda:1"}};
    o.steps_kept = 4;
    o.events_kept = 3;
    control = spawn_control(sys, o, coord);
    metrics_options mo;
    mo.progress = false;
    metrics = spawn_metrics(sys, mo, control);  // no file: only the feed
  }

  ~fixture() {
    for (const auto& a : {caf::actor_cast<caf::actor>(control), caf::actor_cast<caf::actor>(metrics),
                          caf::actor_cast<caf::actor>(coord)})
      caf::anon_send(a, shutdown_atom::value);
    run();
  }

  /// The reply to one request (status and parsed body).
  std::pair<int32_t, nlohmann::json> call(const std::string& method, const std::string& target,
                                          const std::string& body = "") {
    auto a = ask<control_reply>(sys, control, control_request{method, target, body, "test-client"});
    run();
    CAF_REQUIRE(a->value.has_value());
    return {a->value->status, nlohmann::json::parse(a->value->body)};
  }

  static step_report report(int32_t drafter, int64_t step, double ms) {
    step_report r;
    r.drafter = drafter;
    r.step = step;
    r.loss = 10.0 - static_cast<double>(step);
    r.compute_ms = ms;
    return r;
  }
};

} // namespace

CAF_TEST_FIXTURE_SCOPE(control_protocol_tests, fixture)

CAF_TEST(step reports reach the endpoint through the metrics actor and the last ones are kept) {
  for (int64_t k = 1; k <= 6; ++k)
    self->send(metrics, report(static_cast<int32_t>(k % 2), k, 0.5 + static_cast<double>(k)));
  run();
  auto [code, steps] = call("GET", "/v1/steps?n=3");
  CAF_CHECK_EQUAL(code, 200);
  CAF_REQUIRE_EQUAL(steps["steps"].size(), 3u);
  CAF_CHECK_EQUAL(steps["steps"][0]["step"], 4);
  CAF_CHECK_EQUAL(steps["steps"][2]["step"], 6);
  CAF_CHECK_EQUAL(steps["steps"][2]["loss"], 4.0);
  const auto kept = call("GET", "/v1/steps?n=100").second;
  CAF_CHECK_EQUAL(kept["steps"].size(), 4u);  // steps_kept
  // Drafter 1 took steps 1, 3, 5 (1.5, 3.5, 5.5 ms): buckets ≤2, ≤4, ≤8 ms.
  auto [dcode, d1] = call("GET", "/v1/actors/drafter/1");
  CAF_CHECK_EQUAL(dcode, 200);
  CAF_CHECK_EQUAL(d1["device"], "cuda:1");
  CAF_CHECK_EQUAL(d1["steps_handled"], 3);
  CAF_CHECK_EQUAL(d1["last_report"]["step"], 5);
  const auto& h = d1["step_ms_histogram"];
  CAF_CHECK_EQUAL(h[1]["count"], 1);
  CAF_CHECK_EQUAL(h[2]["count"], 1);
  CAF_CHECK_EQUAL(h[3]["count"], 1);
}

CAF_TEST(events keep their sequence numbers and since filters them) {
  self->send(metrics, run_event{epoch_event{0, 64, 0}});
  self->send(metrics, run_event{drafter_failed_event{1, "boom", 3, 1, "memory", 2, "", 1, 3, 0.1}});
  self->send(metrics, run_event{drafter_restarted_event{1, 3, "memory (step 3)"}});
  self->send(metrics, run_event{resumed_event{3, "ckpt/step-3", "disk", 3, 1.0}});
  run();
  auto [code, all] = call("GET", "/v1/events");
  CAF_CHECK_EQUAL(code, 200);
  CAF_REQUIRE_EQUAL(all["events"].size(), 3u);  // events_kept: the first is gone
  CAF_CHECK_EQUAL(all["events"][0]["seq"], 2);
  CAF_CHECK_EQUAL(all["events"][0]["event"], "drafter_failed");
  CAF_CHECK_EQUAL(all["events"][2]["event"], "resumed");
  CAF_CHECK_EQUAL(all["next"], 4);
  const auto since = call("GET", "/v1/events?since=3").second;
  CAF_CHECK_EQUAL(since["events"].size(), 1u);
  auto tree = call("GET", "/v1/tree").second;
  CAF_REQUIRE_EQUAL(tree["actors"].size(), 4u);  // the plan's three, then the control actor's own vitals
  CAF_CHECK_EQUAL(tree["actors"][2]["incarnation"], 1);
  CAF_CHECK_EQUAL(tree["actors"][2]["failures"], 1);
  const auto d1 = call("GET", "/v1/actors/drafter/1").second;
  CAF_CHECK_EQUAL(d1["last_failure"], "boom");
}

CAF_TEST(the tree carries the vitals of each actor and says which did not answer) {
  call("GET", "/v1/status");
  const auto tree = call("GET", "/v1/tree").second;
  const auto& actors = tree["actors"];
  CAF_REQUIRE_EQUAL(actors.size(), 4u);
  // The coordinator's vitals (the recording coordinator's own answer).
  CAF_CHECK_EQUAL(actors[0]["role"], "coordinator");
  CAF_CHECK_EQUAL(actors[0]["messages_handled"], 5);
  CAF_CHECK_EQUAL(actors[0]["last_message"], "status");
  CAF_CHECK_EQUAL(actors[0]["figures"]["step"], 3.0);
  // Drafter 0 answered; drafter 1 never does: no figures, a reason.
  CAF_CHECK_EQUAL(actors[1]["messages_handled"], 9);
  CAF_CHECK_EQUAL(actors[1]["answered"], true);
  CAF_CHECK(!actors[2].contains("messages_handled"));
  CAF_CHECK(actors[2]["vitals"].get<std::string>().find("no answer within") != std::string::npos);
  // The control actor counts itself: the vitals request, two requests before it.
  CAF_CHECK_EQUAL(actors[3]["role"], "control");
  CAF_CHECK_EQUAL(actors[3]["last_message"], "tandem.control_request");
  CAF_CHECK_GREATER_OR_EQUAL(actors[3]["messages_handled"].get<int64_t>(), 2);
  CAF_CHECK_GREATER(actors[3]["thread"].get<int64_t>(), 0);
  CAF_CHECK_EQUAL(actors[3]["figures"]["requests"], 2.0);
  // Drafter 0 does not answer the second time: its last answer, marked.
  const auto again = call("GET", "/v1/tree").second["actors"];
  CAF_CHECK_EQUAL(again[1]["answered"], false);
  CAF_CHECK_EQUAL(again[1]["messages_handled"], 9);
  CAF_CHECK(again[1]["vitals"].get<std::string>().find("its answer of") != std::string::npos);
  CAF_CHECK_GREATER_OR_EQUAL(again[1]["vitals_age_s"].get<double>(), 0.0);
  const auto ledger = call("GET", "/v1/ledger").second;
  CAF_CHECK(ledger["prefetch"].is_array());
}

CAF_TEST(actions go to the coordinator with their source) {
  auto [code, ans] = call("POST", "/v1/pause", "{}");
  CAF_CHECK_EQUAL(code, 200);
  CAF_CHECK_EQUAL(ans["result"], "recorded");
  CAF_CHECK_EQUAL(call("POST", "/v1/stop").first, 200);
  CAF_CHECK_EQUAL(log->order, (std::vector<std::string>{"control pause", "control stop"}));
}

CAF_TEST(bad requests get 4xx and reach nobody) {
  CAF_CHECK_EQUAL(call("GET", "/v2/status").first, 404);
  CAF_CHECK_EQUAL(call("GET", "/v1/pause").first, 405);
  CAF_CHECK_EQUAL(call("POST", "/v1/tree").first, 405);
  CAF_CHECK_EQUAL(call("POST", "/v1/pause", "[1, 2").first, 400);
  CAF_CHECK_EQUAL(call("POST", "/v1/pause", "[1, 2]").first, 400);  // not an object
  CAF_CHECK_EQUAL(call("GET", "/v1/steps?n=-1").first, 400);
  CAF_CHECK_EQUAL(call("GET", "/v1/actors/drafter/2").first, 404);
  CAF_CHECK_EQUAL(call("GET", "/v1/actors/target/0").first, 404);
  CAF_CHECK_EQUAL(call("GET", "/v1/actors/drafter/").first, 400);
  CAF_CHECK_EQUAL(call("POST", "/v1/fault", R"({"drafter": 5, "kind": "throw"})").first, 404);
  CAF_CHECK_EQUAL(call("POST", "/v1/fault", R"({"drafter": 0, "kind": "melt"})").first, 400);
  CAF_CHECK_EQUAL(call("GET", "/v1/\xff\xfe").first, 404);  // not UTF-8: answered, the actor lives on
  CAF_CHECK_EQUAL(call("GET", "/v1").first, 200);
  CAF_CHECK(log->order.empty());
}

CAF_TEST(the refused requests are counted and the config is served) {
  self->send(control, unauthorized_atom::value, std::string("10.0.0.1:1 curl"));
  self->send(control, unauthorized_atom::value, std::string("10.0.0.1:2 curl"));
  run();
  auto [code, status] = call("GET", "/v1/status");
  CAF_CHECK_EQUAL(code, 200);
  CAF_CHECK_EQUAL(status["unauthorized"], 2);
  CAF_CHECK_EQUAL(status["run"], "proto");
  const auto config = call("GET", "/v1/config").second;
  CAF_CHECK_EQUAL(config["toml"], "[train]\nmax_steps = 7\nlog_every = 10\n[other]\nlog_every = 10\n");
  const auto index = call("GET", "/v1").second;
  CAF_CHECK(index["endpoints"].size() > 8);
}

CAF_TEST(an actor the run lacks is named with what it has) {
  // (The plan: coordinator 0, drafters 0 and 1.)
  auto [code, body] = call("GET", "/v1/actors/drafter/-1");
  CAF_CHECK_EQUAL(code, 404);
  CAF_CHECK_EQUAL(body["error"], "no drafter -1: drafter indices are 0..1 (GET /v1/tree lists the actors)");
  std::tie(code, body) = call("GET", "/v1/actors/drafter/2");
  CAF_CHECK_EQUAL(body["error"], "no drafter 2: drafter indices are 0..1 (GET /v1/tree lists the actors)");
  std::tie(code, body) = call("GET", "/v1/actors/coordinator/1");
  CAF_CHECK_EQUAL(body["error"], "no coordinator 1: the only coordinator is 0 (GET /v1/tree lists the actors)");
  std::tie(code, body) = call("GET", "/v1/actors/drafer/0");
  CAF_CHECK_EQUAL(code, 404);
  CAF_CHECK_EQUAL(body["error"], "no role 'drafer': the roles are coordinator, drafter (GET /v1/tree lists the actors)");
  std::tie(code, body) = call("GET", "/v1/actors/drafter/x1");
  CAF_CHECK_EQUAL(code, 400);
  CAF_CHECK(body["error"].get<std::string>().rfind("'x1' is not an actor index", 0) == 0);
  std::tie(code, body) = call("POST", "/v1/fault", R"({"drafter": 5, "kind": "throw"})");
  CAF_CHECK_EQUAL(code, 404);
  CAF_CHECK_EQUAL(body["error"], "no drafter 5: drafter indices are 0..1 (GET /v1/tree lists the actors)");
  CAF_CHECK_EQUAL(call("GET", "/v1/actors/drafter/1").first, 200);
  CAF_CHECK(log->order.empty());
}

CAF_TEST(the config shows train.log_every as the coordinator has it now) {
  log->status = R"({"log_every": 3})";
  const auto changed = call("GET", "/v1/config").second;
  CAF_CHECK_EQUAL(changed["toml"], "[train]\nmax_steps = 7\nlog_every = 3  # set while running (at the start: 10)\n"
                                   "[other]\nlog_every = 10\n");
  log->status = R"({"log_every": 10})";  // set back to its first value: the line as it was
  const auto back = call("GET", "/v1/config").second;
  CAF_CHECK_EQUAL(back["toml"], "[train]\nmax_steps = 7\nlog_every = 10\n[other]\nlog_every = 10\n");
}

CAF_TEST_FIXTURE_SCOPE_END()
