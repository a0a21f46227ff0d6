"""GPT.generate (core/nn/generate.h) against nanoGPT's generate loop in PyTorch on the same
weights: greedy decoding (temperature 0, and top_k=1 at any temperature, where torch.multinomial
has one choice) gives torch's tokens, through the KV cache and past max_seq_len (where both cut
the sequence to its last max_seq_len tokens). Sampling is reproducible under loom.manual_seed and
stays inside the top_k; bad arguments are clear errors."""
import numpy as np
import pytest

import loom

torch = pytest.importorskip("torch")
import gpt2_reference as ref  # noqa: E402  (needs torch)

CFG = dict(max_seq_len=16, vocab=37, padded_vocab=48, layers=2, heads=2, channels=32)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(loom GPT in eval mode, torch parameters) holding the same random weights."""
    params = ref.random_checkpoint(CFG, seed=77)
    # GPT-2 init's logits are nearly flat; larger weights give a clear argmax at every step.
    for name in params:
        if not name.startswith("ln"):
            params[name] = params[name] * 12
    params["wte"][CFG["vocab"]:] = 0
    path = tmp_path_factory.mktemp("generate") / "model.bin"
    ref.write_checkpoint(path, CFG, params)
    config, state = loom.load_gpt(str(path))
    model = loom.nn.GPT(config)
    model.load_state_dict(state)
    model.eval()
    return model, ref.read_checkpoint(path)


def nanogpt_generate(cfg, params, idx, max_new_tokens, temperature=1.0, top_k=None):
    """nanoGPT's GPT.generate, over gpt2_reference's forward."""
    with torch.no_grad():
        for _ in range(max_new_tokens):
            idx_cond = idx if idx.size(1) <= cfg["max_seq_len"] else idx[:, -cfg["max_seq_len"]:]
            logits = ref.forward_logits(cfg, params, idx_cond)[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("Inf")
            probs = torch.softmax(logits, dim=-1)
            idx = torch.cat((idx, torch.multinomial(probs, num_samples=1)), dim=1)
    return idx


def prompt():
    return np.array([[3, 14, 15, 9, 2], [26, 5, 35, 8, 9]], dtype=np.int64)


@pytest.mark.parametrize("new_tokens", [1, 8, 30])  # 5 + 30 > max_seq_len 16: the cut
def test_greedy_tokens_equal_nanogpt(models, new_tokens):
    model, (cfg, params) = models
    want = nanogpt_generate(cfg, params, torch.tensor(prompt()), new_tokens, 0.7, top_k=1)
    got = model.generate(loom.tensor(prompt()), new_tokens, temperature=0.7, top_k=1)
    assert got.shape == (2, 5 + new_tokens)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    greedy = model.generate(loom.tensor(prompt()), new_tokens, temperature=0.0)
    np.testing.assert_array_equal(greedy.numpy(), want.numpy())


def test_cached_logits_equal_torch_forward(models):
    """The last-position logits the cache produces at each step, against torch's full forward of
    the same (greedy) sequence."""
    model, (cfg, params) = models
    seq = nanogpt_generate(cfg, params, torch.tensor(prompt()), 6, 1.0, top_k=1)
    # loom's forward on the prefixes, as generate's cache sees them (positions < max_seq_len).
    with loom.no_grad():
        for t in range(5, 11):
            got = model(loom.tensor(seq[:, :t].numpy())).numpy()[:, -1, :CFG["vocab"]]
            want = ref.forward_logits(cfg, params, seq[:, :t])[:, -1, :].numpy()
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_sampling_is_seeded_and_stays_in_the_top_k(models):
    model, (cfg, params) = models
    idx = loom.tensor(prompt())
    loom.manual_seed(5)
    a = model.generate(idx, 12, temperature=2.0).numpy()
    b = model.generate(idx, 12, temperature=2.0).numpy()
    loom.manual_seed(5)
    np.testing.assert_array_equal(model.generate(idx, 12, temperature=2.0).numpy(), a)
    assert not np.array_equal(a, b), "the second call draws new numbers"
    out = model.generate(idx, 10, temperature=3.0, top_k=3).numpy()
    with torch.no_grad():
        for t in range(5, 15):
            logits = ref.forward_logits(cfg, params, torch.tensor(out[:, :t]))[:, -1, :]
            third = torch.topk(logits, 3).values[:, -1]
            chosen = logits[torch.arange(2), torch.tensor(out[:, t])]
            assert bool((chosen >= third).all()), f"a token outside the top 3 at position {t}"


def test_i32_prompt_and_no_new_tokens(models):
    model, _ = models
    p32 = loom.tensor(prompt().astype(np.int32))
    out = model.generate(p32, 3, temperature=0)
    assert out.dtype == loom.int32
    np.testing.assert_array_equal(model.generate(loom.tensor(prompt()), 0).numpy(), prompt())


def test_bad_arguments_are_clear_errors(models):
    model, _ = models
    idx = loom.tensor(prompt())
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        model.generate(idx, -1)
    with pytest.raises(ValueError, match="temperature must be finite and >= 0"):
        model.generate(idx, 2, temperature=-1.0)
    with pytest.raises(ValueError, match="top_k must be positive or None"):
        model.generate(idx, 2, top_k=0)
    with pytest.raises(ValueError, match=r"top_k must be in \[0, 37\]"):
        model.generate(idx, 2, top_k=40)
    with pytest.raises(ValueError, match=r"idx must be token ids \[B, T\]"):
        model.generate(loom.tensor(np.array([1, 2], dtype=np.int64)), 2)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.generate(loom.tensor(np.array([[40]], dtype=np.int64)), 2)
