// Metrics protocol (messages/metrics.hpp): the real metrics actor of
// actors/metrics.cpp on CAF's deterministic test coordinator, writing its
// JSON lines into a scratch folder (progress off, so nothing on stderr).
// The assertions read the JSON lines, never the progress text.
#define CAF_SUITE metrics_protocol

#include <cmath>
#include <fstream>

#include "actors/spawn.hpp"  // before dsl.hpp (its `inject` macro)
#include "support.hpp"

#include "dsl.hpp"

using namespace tandem;
using namespace tandem::test;

namespace {

struct fixture : test_coordinator_fixture<config> {
  scratch tmp;
  fs::path jsonl = tmp.dir / "run" / "metrics.jsonl";

  metrics_actor spawn(int64_t log_every = 1) {
    metrics_options o;
    o.jsonl = jsonl;
    o.progress = false;
    o.log_every = log_every;
    return spawn_metrics(sys, o);
  }

  std::vector<nlohmann::json> lines() const {
    std::vector<nlohmann::json> out;
    std::ifstream f(jsonl);
    for (std::string line; std::getline(f, line);)
      out.push_back(nlohmann::json::parse(line));
    return out;
  }

  static step_report report(int64_t step, bool finite = true) {
    step_report r;
    r.drafter = 0;
    r.step = step;
    r.batch_id = 100 + step;
    r.loss = finite ? 4.0 - 0.25 * static_cast<double>(step) : std::nan("");
    r.accuracy = 0.5;
    r.grad_norm = 0.75;
    r.lr = 1e-3;
    r.scored_tokens = 200;
    r.real_tokens = 250;
    r.finite = finite;
    r.compute_ms = 12.5;
    r.wait_ms = 0.5 * static_cast<double>(step);
    return r;
  }
};

} // namespace

CAF_TEST_FIXTURE_SCOPE(metrics_protocol_tests, fixture)

CAF_TEST(step reports become JSON lines every log_every steps and on every non-finite step) {
  auto m = spawn(2);
  for (int64_t step = 1; step <= 4; ++step) {
    self->send(m, report(step));
    expect((step_report), from(self).to(m));
  }
  self->send(m, report(5, false));
  run();
  auto l = lines();
  CAF_REQUIRE_EQUAL(l.size(), 3u);
  CAF_CHECK_EQUAL(l[0]["step"], 2);
  CAF_CHECK_EQUAL(l[1]["step"], 4);
  CAF_CHECK_EQUAL(l[2]["step"], 5);
  CAF_CHECK_EQUAL(l[2]["finite"], false);
  CAF_CHECK(l[2]["loss"].is_null());  // NaN has no JSON spelling
  const auto& s = l[1];
  CAF_CHECK_EQUAL(s["event"], "step");
  CAF_CHECK_EQUAL(s["drafter"], 0);
  CAF_CHECK_EQUAL(s["batch"], 104);
  CAF_CHECK_EQUAL(s["loss"], 3.0);
  CAF_CHECK_EQUAL(s["accuracy"], 0.5);
  CAF_CHECK_EQUAL(s["grad_norm"], 0.75);
  CAF_CHECK_EQUAL(s["lr"], 1e-3);
  CAF_CHECK_EQUAL(s["scored_tokens"], 200);
  CAF_CHECK_EQUAL(s["tokens"], 250);
  CAF_CHECK_EQUAL(s["finite"], true);
  CAF_CHECK_EQUAL(s["compute_ms"], 12.5);
  CAF_CHECK_EQUAL(s["wait_ms"], 2.0);  // the drafter's data wait, as reported
  CAF_CHECK(s["time_s"].is_number());
  self->send(m, shutdown_atom::value);
  run();
}

CAF_TEST(events are JSON lines with a time and text that is not JSON is wrapped) {
  auto m = spawn();
  self->send(m, event_atom::value, std::string(R"({"event":"checkpoint","step":3,"dir":"x"})"));
  self->send(m, event_atom::value, std::string("not json {"));
  expect((event_atom, std::string), from(self).to(m).with(_, _));
  expect((event_atom, std::string), from(self).to(m).with(_, "not json {"));
  auto l = lines();
  CAF_REQUIRE_EQUAL(l.size(), 2u);
  CAF_CHECK_EQUAL(l[0]["event"], "checkpoint");
  CAF_CHECK_EQUAL(l[0]["step"], 3);
  CAF_CHECK_EQUAL(l[0]["dir"], "x");
  CAF_CHECK(l[0]["time_s"].is_number());
  CAF_CHECK_EQUAL(l[1]["event"], "text");
  CAF_CHECK_EQUAL(l[1]["text"], "not json {");
  self->send(m, shutdown_atom::value);
  run();
}

CAF_TEST(typed run events are written with the line schema of messages metrics hpp) {
  auto m = spawn();
  drafter_failed_event f;
  f.drafter = 1;
  f.reason = "drafter 1 died at step 7: boom";
  f.restore_step = 4;
  f.steps_lost = 2;
  f.restore_from = "peers";
  f.samples_reissued = 12;
  f.checkpoint = "ckpt/step-4";
  f.restart = 1;
  f.budget = 3;
  f.backoff_s = 0.5;
  const std::vector<run_event> events{
    epoch_event{2, 100, 40},
    checkpoint_event{8, "ckpt/step-8", 16, 64},
    checkpoint_discarded_event{6, "ckpt/step-6"},
    group_formed_event{3, 2, 1, 9},
    group_step_abandoned_event{1},
    drafter_failed_event(f),
    budget_exhausted_event{0, "budget spent"},
    drafter_restarted_event{1, 4, "fresh weights"},
    escalated_event{"target 0 ended", 5},
    end_event{"signal", 10, "ckpt/step-10", 10},
    end_event{"max_steps", 30, "ckpt/step-20", 20, "steps 21..30 are lost"},
    checkpoint_skipped_event{40, 20},
  };
  for (const auto& e : events)
    self->send(m, e);
  run();  // (CAF's expect() cannot name a caf::variant: its tuple picks the variant's converting constructor)
  auto l = lines();
  CAF_REQUIRE_EQUAL(l.size(), events.size());
  for (auto& j : l) {
    CAF_CHECK(j["time_s"].is_number());
    j.erase("time_s");
  }
  using nlohmann::json;
  CAF_CHECK_EQUAL(l[0], json::parse(R"({"event":"epoch","epoch":2,"samples":100,"already_committed":40})"));
  CAF_CHECK_EQUAL(l[1], json::parse(R"({"event":"checkpoint","step":8,"dir":"ckpt/step-8","committed_now":16,"committed":64})"));
  CAF_CHECK_EQUAL(l[2], json::parse(R"({"event":"checkpoint_discarded","step":6,"dir":"ckpt/step-6"})"));
  CAF_CHECK_EQUAL(l[3], json::parse(R"({"event":"group_formed","generation":3,"world":2,"root":1,"step":9})"));
  CAF_CHECK_EQUAL(l[4], json::parse(R"({"event":"group_step_abandoned","drafter":1})"));
  CAF_CHECK_EQUAL(l[5], json::parse(R"({"event":"drafter_failed","drafter":1,"reason":"drafter 1 died at step 7: boom",
    "restore_step":4,"steps_lost":2,"restore_from":"peers","samples_reissued":12,"checkpoint":"ckpt/step-4",
    "restart":1,"budget":3,"backoff_s":0.5})"));
  CAF_CHECK_EQUAL(l[6], json::parse(R"({"event":"budget_exhausted","drafter":0,"report":"budget spent"})"));
  CAF_CHECK_EQUAL(l[7], json::parse(R"({"event":"drafter_restarted","drafter":1,"step":4,"from":"fresh weights"})"));
  CAF_CHECK_EQUAL(l[8], json::parse(R"({"event":"escalated","reason":"target 0 ended","step":5})"));
  CAF_CHECK_EQUAL(l[9], json::parse(R"({"event":"end","reason":"signal","steps":10,"checkpoint":"ckpt/step-10","durable_step":10})"));
  CAF_CHECK_EQUAL(l[10], json::parse(R"({"event":"end","reason":"max_steps","steps":30,"checkpoint":"ckpt/step-20",
    "durable_step":20,"error":"steps 21..30 are lost"})"));
  CAF_CHECK_EQUAL(l[11], json::parse(R"({"event":"checkpoint_skipped","step":40,"writing":20})"));
  CAF_CHECK(l[5]["restart"].is_number_integer());
  CAF_CHECK(l[5]["backoff_s"].is_number_float());
  self->send(m, shutdown_atom::value);
  run();
}

CAF_TEST(a resumed run appends to the JSON lines file) {
  fs::create_directories(jsonl.parent_path());
  std::ofstream(jsonl) << R"({"event":"end","reason":"signal"})" << '\n';
  auto m = spawn();
  self->send(m, event_atom::value, std::string(R"({"event":"epoch","epoch":0})"));
  run();
  auto l = lines();
  CAF_REQUIRE_EQUAL(l.size(), 2u);
  CAF_CHECK_EQUAL(l[0]["event"], "end");
  CAF_CHECK_EQUAL(l[1]["event"], "epoch");
  self->send(m, shutdown_atom::value);
  run();
}

CAF_TEST(no file is written without a path) {
  metrics_options o;
  o.progress = false;
  auto m = spawn_metrics(sys, o);
  self->send(m, report(1));
  self->send(m, event_atom::value, std::string(R"({"event":"x"})"));
  run();
  CAF_CHECK(fs::is_empty(tmp.dir));
  self->send(m, shutdown_atom::value);
  run();
}

CAF_TEST(a message outside the protocol is answered with an error and metrics carry on) {
  auto m = spawn();
  auto a = ask<std::string>(sys, caf::actor_cast<caf::actor>(m), std::string("hello"));
  run();
  CAF_REQUIRE(a->error.has_value());
  CAF_MESSAGE(sys.render(*a->error));
  CAF_CHECK(is(*a->error, errc::unexpected_message));
  CAF_CHECK(contains(sys.render(*a->error), "tandem.metrics cannot handle"));
  self->send(m, event_atom::value, std::string(R"({"event":"after"})"));
  run();
  auto l = lines();
  CAF_REQUIRE_EQUAL(l.size(), 1u);
  CAF_CHECK_EQUAL(l[0]["event"], "after");
  self->send(m, shutdown_atom::value);
  run();
}

CAF_TEST(run name is in every line when set) {
  metrics_options o;
  o.jsonl = jsonl;
  o.progress = false;
  o.run_name = "exp-7";
  o.log_every = 1;
  auto m = spawn_metrics(sys, o);
  self->send(m, report(1));
  self->send(m, run_event{end_event{"max_steps", 1, ""}});
  run();
  auto l = lines();
  CAF_REQUIRE_EQUAL(l.size(), 2u);
  for (const auto& j : l)
    CAF_CHECK_EQUAL(j.value("run", ""), "exp-7");
  self->send(m, shutdown_atom::value);
  run();
}

CAF_TEST(shutdown ends the metrics actor) {
  auto m = spawn();
  auto ex = watch(sys, m);
  run();
  self->send(m, shutdown_atom::value);
  expect((shutdown_atom), from(self).to(m));
  run();
  CAF_REQUIRE_EQUAL(ex->reasons.size(), 1u);
  CAF_CHECK(ex->reasons[0] == caf::exit_reason::normal);
}

CAF_TEST_FIXTURE_SCOPE_END()
