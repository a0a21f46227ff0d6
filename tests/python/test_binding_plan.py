"""loom.plan (planner/ through python/src/plan.cpp): the same records as `loom-plan --json`.
Korthikanti et al.'s 175B layout predicts their measured 13.75 s (the point the A100 preset is
calibrated on; planner_published_test predicts their other seven steps from it); a Llama block
predicts torchtitan's 8B run; a search returns fitting plans, best first, with a reason for each
runner-up; bad input raises ValueError naming it."""
import pytest

import loom

GPT3 = dict(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200, global_batch=64, gpus=64,
            gpu="a100-80gb", execution="megatron")


def test_evaluate_predicts_korthikantis_step():
    p = loom.plan(**GPT3, evaluate="tp=8,pp=8,v=3,mb=1,schedule=interleaved,"
                                   "recompute=selective,sp=1")
    assert p["layout"] == ("dp=1,tp=8,pp=8,v=3,mb=1,schedule=interleaved,zero=0,"
                           "recompute=selective,sp=1")
    assert abs(p["step_s"] / 13.75 - 1) < 0.05, p["step_s"]
    assert not p["oom"] and len(p["memory_per_pipeline_rank"]) == 8
    assert p["memory_bytes"]["total"] == max(r["total"] for r in p["memory_per_pipeline_rank"])


def test_a_llama_block_predicts_torchtitans_run():
    # Llama 3 8B with FSDP2 on 64 A100s, op-level selective recomputation: 2973 tokens/s per GPU
    # measured (planner/data/published_runs.json); a prediction from the A100 preset.
    p = loom.plan(block="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                  seq=8192, vocab=128256, global_batch=64, gpus=64, gpu="a100-80gb",
                  execution="torchtitan", evaluate="zero=3,recompute=selective")
    assert abs(p["tokens_per_s"] / 64 / 2973 - 1) < 0.10, p["tokens_per_s"]
    with pytest.raises(ValueError, match="unknown block 'mamba'"):
        loom.plan(**GPT3, block="mamba")


def test_an_invalid_layout_says_why():
    p = loom.plan(**GPT3, evaluate="tp=8,pp=8,v=5,schedule=interleaved")
    assert "does not divide the 96 layers" in p["problem"]


def test_search_ranks_fitting_plans():
    r = loom.plan(layers=24, hidden=2048, heads=16, global_batch=128, gpus=16, top=3)
    steps = [p["step_s"] for p in r["plans"]]
    assert len(steps) == 3 and steps == sorted(steps)
    assert not any(p["oom"] for p in r["plans"]) and len(r["why_slower"]) == 2
    assert r["simulated"] >= 3 and r["candidates"] > r["simulated"]


def test_bad_input_raises_value_error():
    with pytest.raises(ValueError, match="unknown GPU 'tpu'"):
        loom.plan(**{**GPT3, "gpu": "tpu"})
    with pytest.raises(ValueError, match="unknown layout key 'pq'"):
        loom.plan(**GPT3, evaluate="pq=1")
    with pytest.raises(ValueError, match=r"heads \(5\) must divide hidden \(64\)"):
        loom.plan(layers=2, hidden=64, heads=5, global_batch=8, gpus=8)
    with pytest.raises(ValueError, match="cannot open the profile"):
        loom.plan(**GPT3, profile="/nonexistent/profile.json")


def test_moe_models_plan_expert_parallelism():
    # The same model as planner_moe_test's SearchSplitsExpertsThatDoNotFit, any layout: the expert
    # gradients alone (103 GB) do not fit one H100, so without pipelines only ep > 1 runs.
    moe = dict(layers=16, hidden=4096, heads=32, seq=2048, vocab=32000, global_batch=64, gpus=16,
               moe_experts=64, moe_top_k=2, moe_hidden=6144)
    assert loom.plan(**moe, evaluate="dp=16,zero=3")["oom"]
    p = loom.plan(**moe, evaluate="dp=16,zero=1,ep=16")
    assert p["layout"].endswith(",ep=16") and not p["oom"], p
    # Model FLOPs count the top_k experts a token visits: 3 x (16 MoE layers + logits) x batch.
    s, h, f, V = 2048, 4096, 6144, 32000
    layer = 8 * s * h * h + 4 * s * s * h + 2 * s * h * 64 + 2 * 4 * s * h * f
    flops = 3 * (16 * layer + 2 * s * h * V) * 64
    assert abs(p["model_tflops_per_gpu"] * 1e12 * p["step_s"] * 16 / flops - 1) < 1e-9
    with pytest.raises(ValueError, match=r"top_k \(3\) must be in \[1, experts \(2\)\]"):
        loom.plan(**{**moe, "moe_experts": 2, "moe_top_k": 3})


def test_moe_load_slows_and_grows_the_busiest_rank():
    # moe_load: the busiest rank's experts take that many times the balanced rows (its
    # activations and exchanges grow, so does the step); below 1 is refused.
    moe = dict(layers=16, hidden=4096, heads=32, seq=2048, vocab=32000, global_batch=64, gpus=16,
               moe_experts=64, moe_top_k=2, moe_hidden=6144, evaluate="dp=16,zero=1,ep=16")
    balanced, busy = loom.plan(**moe), loom.plan(**moe, moe_load=1.5)
    assert busy["step_s"] > balanced["step_s"]
    assert busy["memory_bytes"]["total"] > balanced["memory_bytes"]["total"]
    with pytest.raises(ValueError, match=r"MoE load \(0.5\) must be >= 1"):
        loom.plan(**moe, moe_load=0.5)
    # A capacity factor alone plans its worst case: an expert's 1.5 x its share of the batch's
    # 16 ranks x 4 micro-batches, all of which one micro-batch of the ep group of 16 may bring: 6.
    capped = loom.plan(**moe, moe_capacity_factor=1.5)
    assert capped["memory_bytes"]["total"] == loom.plan(**moe, moe_load=6)["memory_bytes"]["total"]
