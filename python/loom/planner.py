"""loom.plan: the parallel planner from Python (planner/, the same as ``loom-plan``).

    import loom
    best = loom.plan(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200,
                     global_batch=1536, gpus=1024, gpu="a100-80gb")["plans"][0]
    print(best["layout"], best["step_s"], best["mfu"])
    one = loom.plan(layers=96, hidden=12288, heads=96, global_batch=64, gpus=64,
                    gpu="a100-80gb", evaluate="tp=8,pp=8,v=3,schedule=interleaved,"
                    "recompute=selective,sp=1")
"""
import json

from loom import _loom


def plan(*, layers, hidden, heads, global_batch, gpus, seq=2048, vocab=51200, gpus_per_node=8,
         gpu="h100-sxm", profile=None, execution="loom", top=5, evaluate=None, moe_experts=0,
         moe_top_k=1, moe_every=1, moe_hidden=0, moe_aux_loss=0.01, block="gpt", ffn_hidden=0,
         kv_heads=0, moe_load=None, moe_capacity_factor=0.0):
    """Ranks the layouts of a GPT on a cluster by predicted step time, or predicts one.

    Returns ``loom-plan --json``'s records as dicts: without ``evaluate``, ``{"plans": [...],
    "why_slower": [...], "candidates", "invalid", "oom", "simulated", "pruned", "search_s"}``
    with the ``top`` fastest layouts that fit in memory, best first; with ``evaluate`` (a layout
    as ``"dp=..,tp=..,pp=..,v=..,mb=..,schedule=..,zero=..,recompute=none|selective|full,sp=0|1"``)
    that layout's record (``"problem"`` says why it cannot run). ``gpu`` is a preset
    (``a100-80gb``, ``h100-sxm``, ``h200``); ``profile`` a file from ``loom-plan --calibrate``
    (or ``planner/profiles/a100-megatron.json``, Megatron-LM's measured A100 rates) overriding
    its rates; ``execution`` whose runtime runs the plan (``loom``, ``loom-f32``,
    ``loom-cpu``, ``megatron``, ``torchtitan``, ``torchtitan-layer-sac``). ``block`` is
    ``"gpt"`` or ``"llama"`` (RMSNorm, SwiGLU MLP, rotary positions, untied output), with
    ``ffn_hidden`` the MLP's width (0: 4 x hidden) and ``kv_heads`` grouped-query attention's
    key/value heads (0: ``heads``), as ``loom-plan --block --ffn-hidden --kv-heads``.
    ``moe_experts`` > 0 makes every ``moe_every``-th layer a
    mixture of experts (``moe_top_k`` per token, each ``moe_hidden`` wide, 0: 4 x hidden), as
    ``loom-plan --moe-*``: the search then chooses the expert-parallel degree too (``ep=..`` in a
    layout); ``moe_aux_loss`` > 0 (loom-gpt's default load-balancing loss) counts loom's routing
    pass over the batch; ``moe_load`` (>= 1) is the busiest rank's routed rows over the balanced
    share and ``moe_capacity_factor`` loom-gpt's capacity, which bounds it (without ``moe_load``
    the plan takes that bound; dropless, balanced routing), as ``loom-plan --moe-load
    --moe-capacity-factor``.
    Bad arguments raise ValueError naming them.
    """
    text = _loom._plan(int(layers), int(hidden), int(heads), int(seq), int(vocab),
                       int(global_batch), int(gpus), int(gpus_per_node), str(gpu),
                       profile or "", str(execution), int(top), evaluate or "",
                       int(moe_experts), int(moe_top_k), int(moe_every), int(moe_hidden),
                       float(moe_aux_loss), str(block), int(ffn_hidden), int(kv_heads),
                       None if moe_load is None else float(moe_load), float(moe_capacity_factor))
    return json.loads(text)
