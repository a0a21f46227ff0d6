#!/bin/bash
# loom-ckpt end to end on a checkpoint loom-gpt writes: inspect names the step and the tensors;
# verify passes, then fails naming the checksum once one byte of a data file is flipped; export
# writes a Hugging Face GPT-2 directory whose tensors are exactly the checkpoint's (vocab padding
# dropped, Conv1D matrices transposed), checked with numpy against the stored pieces, and which
# loom-gpt loads back (also as a Hub directory whose head count is only in config.json). Bad usage is covered by the loom_ckpt_error tests (CMakeLists.txt).
# usage: ckpt_cli.sh LOOM_CKPT LOOM_GPT
set -euo pipefail
ckpt=$1
gpt=$2
py=/usr/bin/python3  # Debian's, which has numpy (See DESIGN.md, "Facts about the machines")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
  echo "ckpt_cli: $*" >&2
  exit 1
}

help=$("$gpt" --help)  # whole, so grep -q cannot cut the pipe under pipefail
if ! grep -q -- --checkpoint-dir <<< "$help"; then
  echo "skipped: loom-gpt has no --checkpoint-dir yet"
  exit 0
fi

export OMP_NUM_THREADS=1
"$gpt" --steps 3 --checkpoint-dir "$dir/ckpt" --save-every 2 --layers 2 --dim 32 --heads 2 \
  --batch 8 > "$dir/train.log" || { cat "$dir/train.log"; fail "loom-gpt could not save"; }

out=$("$ckpt" inspect "$dir/ckpt")
echo "$out"
grep -qE '^step +3$' <<< "$out" || fail "inspect of the root does not show step 3"
grep -qE '^model\.wte\.weight +f32 +\[[0-9]+, 32\]' <<< "$out" || fail "inspect lists no wte"
grep -qE '^total: [0-9]+ tensors' <<< "$out" || fail "inspect prints no total"
step_dir=$(sed -n 's/^checkpoint  *//p' <<< "$out")
[[ -f $step_dir/manifest.json ]] || fail "inspect names '$step_dir', not a step directory"
"$ckpt" inspect "$step_dir" --json | "$py" -c 'import json, sys
s = json.load(sys.stdin)
assert s["model"]["layers"] == 2 and s["model"]["channels"] == 32, s' ||
  fail "inspect --json does not give the run state"

out=$("$ckpt" verify "$dir/ckpt")
echo "$out"
grep -qE '^ok: [0-9]+ files, [0-9]+ bytes, [0-9]+ tensors verified in [0-9.]+ s$' <<< "$out" ||
  fail "verify of an intact checkpoint does not say ok"

# Export before damaging anything; the numpy check reads the same stored pieces.
"$ckpt" export "$dir/ckpt" --hf "$dir/hf"
[[ -s $dir/hf/config.json && -s $dir/hf/model.safetensors ]] || fail "export wrote no files"
# Debian's python3 has numpy (install-deps.sh); an image without it (the GPU machine's Ubuntu
# python3) skips this one check, saying so, and runs the rest.
if ! "$py" -c 'import numpy' 2>/dev/null; then
  echo "SKIP: the numpy check of the export ($py has no numpy)"
else
"$py" - "$step_dir" "$dir/hf" <<'EOF'
# The exported tensors against the checkpoint's model.* pieces, assembled by region.
import json, os, sys
import numpy as np

step_dir, hf = sys.argv[1], sys.argv[2]
m = json.load(open(os.path.join(step_dir, "manifest.json")))
cfg = json.load(open(os.path.join(hf, "config.json")))
model = m["state"]["model"]
assert cfg["model_type"] == "gpt2" and cfg["architectures"] == ["GPT2LMHeadModel"], cfg
for ours, theirs in [("layers", "n_layer"), ("heads", "n_head"), ("channels", "n_embd"),
                     ("vocab", "vocab_size"), ("max_seq_len", "n_positions"),
                     ("max_seq_len", "n_ctx")]:
    assert cfg[theirs] == model[ours], (theirs, cfg[theirs], model[ours])

def stored(name):
    t = m["tensors"][name]
    assert t["dtype"] == "F32", (name, t["dtype"])
    out = np.zeros(t["shape"], np.float32)
    seen = np.zeros(t["shape"], bool)
    for p in t["pieces"]:
        with open(os.path.join(step_dir, p["file"]), "rb") as f:
            f.seek(p["offset"])
            data = np.frombuffer(f.read(p["nbytes"]), "<f4")
        n = int(np.prod(p["box_shape"]))
        box, mask = np.zeros(n, np.float32), np.zeros(n, bool)
        box[p["range"][0]:p["range"][1]] = data
        mask[p["range"][0]:p["range"][1]] = True
        at = tuple(slice(o, o + s) for o, s in zip(p["box_offset"], p["box_shape"]))
        view, held = out[at], seen[at]
        view[mask.reshape(p["box_shape"])] = box[mask]
        held[mask.reshape(p["box_shape"])] = True
    assert seen.all(), name
    return out

with open(os.path.join(hf, "model.safetensors"), "rb") as f:
    n = int.from_bytes(f.read(8), "little")
    header = json.loads(f.read(n))
    body = f.read()
meta = header.pop("__metadata__")
assert meta["format"] == "pt", meta
def exported(name):
    e = header.pop(name)
    assert e["dtype"] == "F32", (name, e)
    b, end = e["data_offsets"]
    return np.frombuffer(body[b:end], "<f4").reshape(e["shape"])

layer = {"ln_1.weight": "ln1.weight", "ln_1.bias": "ln1.bias", "attn.c_attn.weight":
         "attn.qkv.weight", "attn.c_attn.bias": "attn.qkv.bias", "attn.c_proj.weight":
         "attn.proj.weight", "attn.c_proj.bias": "attn.proj.bias", "ln_2.weight": "ln2.weight",
         "ln_2.bias": "ln2.bias", "mlp.c_fc.weight": "mlp.fc.weight", "mlp.c_fc.bias":
         "mlp.fc.bias", "mlp.c_proj.weight": "mlp.proj.weight", "mlp.c_proj.bias": "mlp.proj.bias"}
pairs = [("wte.weight", "wte.weight"), ("wpe.weight", "wpe.weight"),
         ("ln_f.weight", "ln_f.weight"), ("ln_f.bias", "ln_f.bias")]
for i in range(model["layers"]):
    pairs += [(f"h.{i}.{hf_name}", f"blocks.{i}.{loom}") for hf_name, loom in layer.items()]
for hf_name, loom in pairs:
    want = stored("model." + loom)
    if loom == "wte.weight":
        want = want[:model["vocab"]]  # the padding rows are not exported
    elif hf_name.startswith("h.") and want.ndim == 2:
        want = want.T  # the blocks' Conv1D matrices are (in, out)
    got = exported(hf_name)
    assert got.shape == want.shape, (hf_name, got.shape, want.shape)
    assert np.array_equal(got, want), hf_name
assert not header, f"unexpected exported tensors: {sorted(header)}"
print(f"export matches the checkpoint: {len(pairs)} tensors")
EOF
fi
out=$("$gpt" --init-from "$dir/hf/model.safetensors" --eval-only --batch 8)
echo "$out"
grep -qE '^val_loss [0-9.]+' <<< "$out" || fail "loom-gpt cannot evaluate the exported weights"
want_loss=$(sed -n 's/^val_loss //p' <<< "$out")

# As from the Hub: the head count only in config.json (the file's metadata dropped). The directory
# loads without --heads, and --heads 2 with --dim left at its default is checked against the file.
"$py" - "$dir/hf" "$dir/hub" <<'EOF'
import json, os, struct, sys
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst)
raw = open(f"{src}/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
header["__metadata__"] = {"format": "pt"}
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open(f"{dst}/model.safetensors", "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])
open(f"{dst}/config.json", "w").write(open(f"{src}/config.json").read())
EOF
for args in "--init-from $dir/hub" "--init-from $dir/hub/model.safetensors --heads 2"; do
  # shellcheck disable=SC2086  # $args holds flags
  out=$("$gpt" $args --eval-only --batch 8)
  grep -qxF "val_loss $want_loss" <<< "$out" || fail "$args: '$out', expected val_loss $want_loss"
done
err=$("$gpt" --init-from "$dir/hub" --heads 4 --eval-only --batch 8 2>&1 >/dev/null) &&
  fail "a --heads that contradicts config.json was accepted"
grep -q "config.json says n_head 2 but 4 heads were asked for" <<< "$err" || fail "$err"
echo "a Hugging Face directory loads with its config.json's head count"
# --heads given with --init-from is checked against the file's width, not --dim's default (128,
# which 3 does not divide).
"$gpt" --steps 1 --layers 1 --dim 48 --heads 3 --batch 8 --save "$dir/w48.safetensors" > /dev/null
"$gpt" --heads 3 --init-from "$dir/w48.safetensors" --eval-only --batch 8 | grep -q '^val_loss' ||
  fail "--heads 3 --init-from a dim-48 file was refused"

# One flipped byte in the middle of wte's stored bytes (data, never the file's header).
read -r file at < <("$py" -c 'import json, sys
p = json.load(open(sys.argv[1] + "/manifest.json"))["tensors"]["model.wte.weight"]["pieces"][0]
print(p["file"], p["offset"] + p["nbytes"] // 2)' "$step_dir")
"$py" -c 'import sys
path, at = sys.argv[1], int(sys.argv[2])
with open(path, "r+b") as f:
    f.seek(at); b = f.read(1); f.seek(at); f.write(bytes([b[0] ^ 0xFF]))' "$step_dir/$file" "$at"
status=0
err=$("$ckpt" verify "$step_dir" 2>&1 >/dev/null) || status=$?
echo "$err"
[[ $status == 1 ]] || fail "verify of a damaged checkpoint exited $status, expected 1"
grep -q "checksum" <<< "$err" || fail "verify's error does not mention the checksum"
grep -q "$file" <<< "$err" || fail "verify's error does not name the damaged file $file"
echo "ckpt_cli: ok"
