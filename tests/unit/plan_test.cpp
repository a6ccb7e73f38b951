// The launch plan (launch/plan.hpp): every config key is used — a
// non-default value of each changes the plan or `tandem prepare`'s
// arguments, or (placement.prefetch, whose only other values are refused)
// is an error naming it; the options structs carry the config's values; the
// inventory bounds the placement; resume and defaults.
#include <map>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "launch/plan.hpp"

using namespace tandem;

namespace {

const std::string base_text = "[model]\n"
                              "target = \"/models/q\"\n"
                              "[drafter]\n"
                              "mask_token_id = 7\n"
                              "[data]\n"
                              "path = \"/data/d\"\n"
                              "[[faults.inject]]\n"
                              "drafter = 0\n"
                              "kind = \"throw\"\n"
                              "at_step = 5\n";

const data_facts facts{1000, 2'000'000};

/// The plan and the prepare arguments of base_text with `overrides`, on 8
/// GPUs (and a member gpu-c with 8, which only a placement naming it uses).
std::string observe(const std::vector<std::string>& overrides, const std::string& text = base_text) {
  auto c = parse_run_config(text, "/cfg/run.toml", overrides);
  auto devices = inventory::this_host(8);
  devices.nodes.push_back({"gpu-c", 8});
  auto p = make_plan(c, devices, facts);
  std::string out = to_json(p);
  for (const auto& a : prepare_arguments(c))
    out += "\nprepare " + a;
  for (const auto& a : eval_prompt_arguments(c, "/out/eval-prompts.jsonl"))
    out += "\nrender " + a;
  return out;
}

/// One use of a key: `set` (a --set override) changes what `observe` sees,
/// against the same config with `base` applied.
struct use {
  std::string set;
  std::vector<std::string> base;
};

const std::map<std::string, use>& uses() {
  static const std::map<std::string, use> table{
    {"model.target", {"model.target=/models/other"}},
    {"model.tap_layers", {"model.tap_layers=1,2"}},
    {"model.dtype", {"model.dtype=bfloat16"}},
    {"drafter.layers", {"drafter.layers=2"}},
    {"drafter.block_size", {"drafter.block_size=8"}},
    {"drafter.mask_token_id", {"drafter.mask_token_id=9"}},
    {"drafter.seed", {"drafter.seed=5"}},
    {"drafter.init_from", {"drafter.init_from=/ckpt/zlab"}},
    {"data.path", {"data.path=/data/other"}},
    {"data.sources", {"data.sources=/chat/a.jsonl"}},
    {"data.tokenizer", {"data.tokenizer=/tok", {"data.sources=/chat/a.jsonl"}}},
    {"data.seq_len", {"data.seq_len=4096"}},
    {"data.rows", {"data.rows=2"}},
    {"data.anchors", {"data.anchors=256"}},
    {"data.max_docs", {"data.max_docs=8"}},
    {"data.lookahead", {"data.lookahead=32"}},
    {"data.seed", {"data.seed=3"}},
    {"data.epochs", {"data.epochs=2"}},
    {"train.lr", {"train.lr=0.001"}},
    {"train.warmup_ratio", {"train.warmup_ratio=0.1"}},
    {"train.weight_decay", {"train.weight_decay=0.01"}},
    {"train.grad_clip", {"train.grad_clip=0.5"}},
    {"train.beta1", {"train.beta1=0.8"}},
    {"train.beta2", {"train.beta2=0.99"}},
    {"train.eps", {"train.eps=1e-6"}},
    {"train.max_steps", {"train.max_steps=7"}},
    {"train.chunk_rows", {"train.chunk_rows=512"}},
    {"train.log_every", {"train.log_every=5"}},
    {"placement.targets", {"placement.targets=cuda:0,cuda:1"}},
    {"placement.drafters", {"placement.drafters=cuda:2,cuda:3"}},
    {"runtime.credits", {"runtime.credits=8"}},
    {"runtime.heartbeat_s", {"runtime.heartbeat_s=5"}},
    {"runtime.step_timeout_s", {"runtime.step_timeout_s=60"}},
    {"runtime.group_timeout_s", {"runtime.group_timeout_s=10"}},
    {"runtime.capture_graphs", {"runtime.capture_graphs=false"}},
    {"runtime.gpu_memory_fraction", {"runtime.gpu_memory_fraction=0.5"}},
    {"checkpoint.dir", {"checkpoint.dir=ck"}},
    {"checkpoint.every_steps", {"checkpoint.every_steps=50"}},
    {"checkpoint.keep", {"checkpoint.keep=5"}},
    {"checkpoint.memory_every", {"checkpoint.memory_every=4", {"placement.drafters=cuda:0"}}},  // one drafter
    {"checkpoint.on_signal", {"checkpoint.on_signal=false"}},
    {"checkpoint.host_every", {"checkpoint.host_every=10"}},
    {"checkpoint.host_dir", {"checkpoint.host_dir=/dev/shm/elsewhere"}},
    {"supervision.restart_budget", {"supervision.restart_budget=1"}},
    {"supervision.backoff_s", {"supervision.backoff_s=0.5"}},
    {"supervision.window_s", {"supervision.window_s=60"}},
    {"supervision.worker_restarts", {"supervision.worker_restarts=0"}},
    {"metrics.jsonl", {"metrics.jsonl=m.jsonl"}},
    {"metrics.progress", {"metrics.progress=false"}},
    {"metrics.every_s", {"metrics.every_s=2"}},
    {"metrics.tensorboard", {"metrics.tensorboard=board"}},
    {"control.listen", {"control.listen=127.0.0.1:7000"}},
    {"control.tls_cert", {"control.tls_cert=/pki/b.pem", {"control.tls_cert=/pki/a.pem", "control.tls_key=/pki/a.key"}}},
    {"control.tls_key", {"control.tls_key=/pki/b.key", {"control.tls_cert=/pki/a.pem", "control.tls_key=/pki/a.key"}}},
    {"cluster.listen", {"cluster.listen=127.0.0.1:7001"}},
    {"cluster.name", {"cluster.name=head", {"cluster.listen=127.0.0.1:7001"}}},
    {"cluster.join_timeout_s", {"cluster.join_timeout_s=60", {"cluster.listen=127.0.0.1:7001"}}},
    {"cluster.heartbeat_s", {"cluster.heartbeat_s=1", {"cluster.listen=127.0.0.1:7001"}}},
    {"cluster.timeout_s", {"cluster.timeout_s=30", {"cluster.listen=127.0.0.1:7001"}}},
    {"cluster.secret", {"cluster.secret=/pki/cluster.secret", {"cluster.listen=127.0.0.1:7001"}}},
    {"cluster.certs", {"cluster.certs=/pki/leader", {"cluster.listen=127.0.0.1:7001", "cluster.secret=/pki/s"}}},
    {"cluster.transport", {"cluster.transport=nccl", {"cluster.listen=127.0.0.1:7001"}}},
    {"placement.spares", {"placement.spares=gpu-c:cuda:0", {"cluster.listen=127.0.0.1:7001"}}},
    {"eval.prompts", {"eval.prompts=/chat/held.jsonl"}},
    {"eval.count", {"eval.count=4", {"eval.prompts=/chat/held.jsonl"}}},
    {"eval.max_new_tokens", {"eval.max_new_tokens=64", {"eval.prompts=/chat/held.jsonl"}}},
    {"eval.every_steps", {"eval.every_steps=50", {"eval.prompts=/chat/held.jsonl"}}},
    {"eval.at_end", {"eval.at_end=false", {"eval.prompts=/chat/held.jsonl"}}},
    {"eval.temperature", {"eval.temperature=0.7", {"eval.prompts=/chat/held.jsonl"}}},
    {"eval.device", {"eval.device=cuda:5", {"eval.prompts=/chat/held.jsonl"}}},
    {"run.output_dir", {"run.output_dir=/tmp/out"}},
    {"run.name", {"run.name=other"}},
  };
  return table;
}

} // namespace

TEST(plan, every_config_key_changes_the_plan_or_a_named_observable) {
  std::set<std::string> checked;
  for (const auto& key : run_config_keys()) {
    if (key.rfind("faults.inject.", 0) == 0) {
      // [[faults.inject]] tables: no --set; vary the base table's field.
      const std::map<std::string, std::pair<std::string, std::string>> edit{
        {"faults.inject.drafter", {"drafter = 0", "drafter = 1"}},
        {"faults.inject.target", {"drafter = 0", "target = 0"}},
        {"faults.inject.prefetch", {"drafter = 0", "prefetch = 0"}},
        {"faults.inject.kind", {"kind = \"throw\"", "kind = \"nan\""}},
        {"faults.inject.at_step", {"at_step = 5", "at_step = 6"}}};
      auto it = edit.find(key);
      ASSERT_NE(it, edit.end()) << key << ": a fault field this test does not know";
      auto text = base_text;
      text.replace(text.find(it->second.first), it->second.first.size(), it->second.second);
      EXPECT_NE(observe({}, text), observe({})) << key << " changes nothing";
      checked.insert(key);
      continue;
    }
    if (key == "placement.prefetch") {
      // "per_target" is the only layout: any other value is refused, by name.
      try {
        observe({"placement.prefetch=per_node"});
        ADD_FAILURE() << "placement.prefetch=per_node was accepted";
      } catch (const config_error& e) {
        EXPECT_NE(std::string(e.what()).find("placement.prefetch"), std::string::npos) << e.what();
      }
      checked.insert(key);
      continue;
    }
    auto it = uses().find(key);
    ASSERT_NE(it, uses().end()) << key << " has no use in this test: say what it changes";
    auto with = it->second.base;
    with.push_back(it->second.set);
    EXPECT_NE(observe(with), observe(it->second.base)) << key << " (" << it->second.set
                                                       << ") changes nothing in the plan";
    checked.insert(key);
  }
  EXPECT_EQ(checked.size(), run_config_keys().size());
}

TEST(plan, places_the_eval_actor_on_a_free_gpu_else_beside_the_first_drafter_else_the_cpu) {
  auto eval_device = [](int32_t gpus, std::vector<std::string> overrides) {
    overrides.push_back("eval.prompts=/chat/held.jsonl");
    auto c = parse_run_config(base_text, "/cfg/run.toml", overrides);
    auto p = make_plan(c, inventory::this_host(gpus), facts);
    EXPECT_TRUE(p.eval.has_value());
    EXPECT_EQ(p.placement.eval.size(), 1u);
    return p.eval ? p.eval->device : -2;
  };
  EXPECT_EQ(eval_device(4, {"placement.targets=cuda:0", "placement.drafters=cuda:1"}), 2);
  EXPECT_EQ(eval_device(2, {"placement.targets=cuda:0", "placement.drafters=cuda:1"}), 1);  // shares the drafter's
  EXPECT_EQ(eval_device(1, {}), 0);
  EXPECT_EQ(eval_device(0, {}), -1);
  EXPECT_EQ(eval_device(4, {"eval.device=cpu"}), -1);
  EXPECT_EQ(eval_device(4, {"eval.device=cuda:3"}), 3);
  // Off without eval.prompts, and refused on a GPU the host lacks, by name.
  EXPECT_FALSE(make_plan(parse_run_config(base_text, "/cfg/run.toml", {}), inventory::this_host(1), facts).eval);
  try {
    eval_device(2, {"eval.device=cuda:7"});
    ADD_FAILURE() << "eval.device=cuda:7 on 2 GPUs was accepted";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("eval.device"), std::string::npos) << e.what();
  }
  try {
    parse_run_config(base_text, "/cfg/run.toml", {"eval.device=tpu:0"});
    ADD_FAILURE() << "eval.device=tpu:0 was accepted";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("eval.device"), std::string::npos) << e.what();
  }
}

TEST(plan, carries_the_values_into_every_options_struct) {
  auto c = parse_run_config(base_text, "/cfg/run.toml",
                            {"placement.targets=cuda:0,cuda:1", "placement.drafters=cuda:2,cuda:3",
                             "drafter.seed=10", "runtime.credits=2", "checkpoint.on_signal=false",
                             "run.name=exp1", "drafter.init_from=/z", "train.max_steps=3", "train.log_every=7"});
  auto p = make_plan(c, inventory::this_host(4), facts);
  ASSERT_EQ(p.prefetch.size(), 2u);
  ASSERT_EQ(p.targets.size(), 2u);
  ASSERT_EQ(p.drafters.size(), 2u);
  EXPECT_EQ(p.prefetch[1].rank, 1);
  EXPECT_EQ(p.prefetch[1].world, 2);
  EXPECT_EQ(p.prefetch[1].device, 1);
  EXPECT_EQ(p.targets[1].device, 1);
  EXPECT_EQ(p.drafters[0].device, 2);
  EXPECT_EQ(p.drafters[1].device, 3);
  EXPECT_EQ(p.drafters[0].seed, 10u);  // the drafter's seed plus its index
  EXPECT_EQ(p.drafters[1].seed, 11u);
  EXPECT_EQ(p.drafters[1].init_from, "/z");
  EXPECT_EQ(p.coordinator.credits, 2);
  EXPECT_EQ(p.coordinator.num_samples, 1000);
  EXPECT_FALSE(p.coordinator.checkpoint_on_stop);
  EXPECT_FALSE(p.checkpoint_on_signal);
  EXPECT_EQ(p.run_name, "exp1");
  EXPECT_EQ(p.metrics.run_name, "exp1");
  EXPECT_EQ(p.metrics.log_every, 7);
  EXPECT_EQ(p.coordinator.log_every, 7);  // its status shows the value a log_every action changes
  // The schedule: 2M tokens / (1 × 3072 × 0.9) + 1 steps; max_steps only shortens the ETA.
  EXPECT_EQ(p.schedule_steps, 2'000'000 * 10 / 27648 + 1);
  EXPECT_EQ(p.drafters[0].total_steps, p.schedule_steps);
  EXPECT_EQ(p.metrics.total_steps, 3);
  // Counted steps (gpu::data::count_steps, what tandem run passes) win over the estimate.
  const auto counted = make_plan(c, inventory::this_host(4), data_facts{1000, 2'000'000, 777});
  EXPECT_EQ(counted.schedule_steps, 777);
  EXPECT_EQ(counted.drafters[0].total_steps, 777);
  EXPECT_EQ(p.checkpointer.dir, c.checkpoint_dir());
  EXPECT_EQ(p.metrics.jsonl, c.metrics_file());
  EXPECT_TRUE(p.restore_from.empty());
}

TEST(plan, the_run_name_defaults_to_the_config_stem) {
  auto p = make_plan(parse_run_config(base_text, "/cfg/run.toml"), inventory::this_host(0), facts);
  EXPECT_EQ(p.run_name, "run");
  EXPECT_EQ(p.placement.targets.at(0).device, -1);  // auto on a host without GPUs: the CPU
}

TEST(plan, resume_names_the_checkpoint_everywhere) {
  auto c = parse_run_config(base_text, "/cfg/run.toml");
  auto p = make_plan(c, inventory::this_host(1), facts, resume_point{"/ck/step-40", 40, "{}"});
  EXPECT_EQ(p.restore_from, "/ck/step-40");
  EXPECT_EQ(p.coordinator.resume_checkpoint, "/ck/step-40");
  EXPECT_EQ(p.coordinator.resume_step, 40);
  EXPECT_EQ(p.coordinator.resume_ledger, "{}");
}

TEST(plan, the_inventory_bounds_the_placement) {
  auto c = parse_run_config(base_text, "/cfg/run.toml", {"placement.drafters=cuda:3"});
  EXPECT_NO_THROW(make_plan(c, inventory::this_host(4), facts));
  try {
    make_plan(c, inventory::this_host(2), facts);
    ADD_FAILURE() << "cuda:3 placed on a host with 2 GPUs";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("placement.drafters"), std::string::npos) << e.what();
  }
  // Members: "NODE:cuda:N" is checked against that node's GPUs; the
  // leader's own name is this process; an unknown node is named.
  auto cl = parse_run_config(base_text, "/cfg/run.toml",
                             {"cluster.listen=127.0.0.1:7001", "placement.targets=gpu-a:cuda:1",
                              "placement.drafters=leader:cuda:0,gpu-b:cuda:0"});
  inventory three{{inventory::node{"local", 1}, inventory::node{"gpu-a", 2}, inventory::node{"gpu-b", 1}}};
  const auto p = make_plan(cl, three, facts);
  EXPECT_EQ(p.placement.targets[0].node, "gpu-a");
  EXPECT_EQ(p.placement.targets[0].device, 1);
  EXPECT_EQ(p.placement.prefetch[0].node, "gpu-a");
  EXPECT_EQ(p.placement.drafters[0].node, "");
  EXPECT_EQ(p.placement.drafters[1].node, "gpu-b");
  ASSERT_TRUE(p.cluster);
  EXPECT_EQ(p.cluster->members, (std::vector<std::string>{"gpu-a", "gpu-b"}));
  EXPECT_EQ(placement_nodes(cl), (std::vector<std::string>{"gpu-a", "gpu-b"}));
  EXPECT_NE(p.placement.describe().find("gpu-b:cuda:0: drafter 1"), std::string::npos) << p.placement.describe();
  inventory small{{inventory::node{"local", 1}, inventory::node{"gpu-a", 1}, inventory::node{"gpu-b", 1}}};
  try {
    make_plan(cl, small, facts);
    ADD_FAILURE() << "gpu-a:cuda:1 placed on a node with 1 GPU";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("node 'gpu-a' has 1 GPU"), std::string::npos) << e.what();
  }
  inventory missing{{inventory::node{"local", 1}, inventory::node{"gpu-a", 2}}};
  try {
    make_plan(cl, missing, facts);
    ADD_FAILURE() << "a node that has not joined was placed on";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("names node 'gpu-b', which has not joined (joined: gpu-a)"),
              std::string::npos) << e.what();
  }
  // A placement naming nodes needs a leader address.
  auto no_listen = parse_run_config(base_text, "/cfg/run.toml", {"placement.drafters=gpu-b:cpu"});
  try {
    make_plan(no_listen, three, facts);
    ADD_FAILURE() << "nodes named without cluster.listen";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("cluster.listen is empty"), std::string::npos) << e.what();
  }
  // Two data-parallel drafters on the same device of the same node.
  auto twice = parse_run_config(base_text, "/cfg/run.toml",
                                {"cluster.listen=127.0.0.1:7001", "placement.drafters=gpu-a:cuda:0,gpu-a:cuda:0"});
  EXPECT_THROW(make_plan(twice, three, facts), config_error);
}

TEST(plan, credits_must_cover_the_data_parallel_drafters) {
  EXPECT_TRUE(credits_cover_drafters(1, 1, 1));
  EXPECT_TRUE(credits_cover_drafters(2, 1, 2));
  EXPECT_FALSE(credits_cover_drafters(1, 1, 2));
  EXPECT_TRUE(credits_cover_drafters(1, 3, 3));
  auto c = parse_run_config(base_text, "/cfg/run.toml",
                            {"placement.targets=cuda:0", "placement.drafters=cuda:0,cuda:1,cuda:2",
                             "runtime.credits=2"});
  EXPECT_THROW(make_plan(c, inventory::this_host(3), facts), config_error);
}
