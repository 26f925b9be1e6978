#!/usr/bin/env bash
# Before/after check for refactors (issue 12): run one tq binary over a fixed set of jobs on
# SmolLM2 and print the sha256 of every output. Run it with the old and the new binary and diff
# the two lists; only files that record their own path (inspect.txt, eval.json's "model") and
# timings in the JSON reports may differ.
#
#   bash scripts/dev/compare-outputs.sh TQ_BIN OUT_DIR
source "$(dirname "$0")/../common.sh"
tq=$1; o=$2; mkdir -p "$o"
smol=$("$TQ_ROOT/scripts/fetch-data.sh")
botchan=$("$TQ_ROOT/scripts/fetch-botchan.sh")
wiki="$TQ_ROOT/../shared/data/wikitext-2-raw-test.txt"
f16="$o/smol-f16.gguf"
[ -f "$f16" ] || "$tq" convert "$smol" --weights f16 -q -o "$f16"
"$tq" convert "$f16" --weights tq4_1s -q -o "$o/pure.gguf"
"$tq" convert "$f16" --weights tq4_1s --recipe config-i -q -o "$o/ci.gguf"
"$tq" calib "$f16" --text "$botchan" --tokens 2048 -o "$o/H.safetensors" 2>/dev/null
"$tq" convert "$f16" --weights tq4_1s --calib "$o/H.safetensors" -q -o "$o/ldlq.gguf"
"$tq" convert "$f16" --weights tq3_1s --recipe config-i --calib "$o/H.safetensors" -q -o "$o/ldlq3.gguf"
# Calibration modes and encoders through the pipeline: inline text (batched and sequential), an
# imatrix, stock-type LDLQ, the 2-bit row-rotated and trellis types (on block 0 only: tq2_t's
# search is minutes per block), and a --target-size mix with its KLD fit.
"$tq" calib "$f16" --text "$botchan" --tokens 2048 --imatrix-out "$o/im.gguf" -o "$o/H2.safetensors" 2>/dev/null
"$tq" convert "$f16" --weights tq4_1s --calib "$botchan" --calib-tokens 2048 -q -o "$o/text.gguf"
"$tq" convert "$f16" --weights tq4_1s --calib "$botchan" --calib-tokens 1024 --calib-sequential -q -o "$o/seq.gguf"
"$tq" convert "$f16" --weights q4_K --imatrix "$o/im.gguf" -q -o "$o/imatrix.gguf"
"$tq" convert "$f16" --weights q4_K --calib "$o/H.safetensors" -q -o "$o/stock-ldlq.gguf"
"$tq" convert "$f16" --weights q8_0 --tensor-type 'blk\.0\.=tq2_r' --calib "$o/H.safetensors" -q -o "$o/tq2r.gguf"
"$tq" convert "$f16" --weights q8_0 --tensor-type 'blk\.0\.(attn_k|attn_v|ffn_down)=tq2_t' --calib "$o/H.safetensors" -q -o "$o/tq2t.gguf"
"$tq" convert "$f16" --target upstream --target-size 105466560 --calib "$o/H.safetensors" --kld-text "$botchan" --kld-probes 4 --mix-rows 16 -q -o "$o/mix.gguf"
"$tq" eval "$o/ldlq.gguf" --ref "$f16" -f "$wiki" --chunks 4 -q --json > "$o/eval.json"
"$tq" eval "$f16" -f "$wiki" --chunks 2 --ctk q8_0 --ctv turbo3 -q --json > "$o/eval-kv.json"
"$tq" kv "$f16" --json > "$o/kv.json"
"$tq" codebook --head-dim 160 --bits 3 --format c > "$o/cb.c"
"$tq" inspect "$o/ldlq.gguf" > "$o/inspect.txt"
(cd "$o" && sha256sum pure.gguf ci.gguf ldlq.gguf ldlq3.gguf H.safetensors text.gguf seq.gguf im.gguf imatrix.gguf stock-ldlq.gguf tq2r.gguf tq2t.gguf mix.gguf eval.json eval-kv.json kv.json cb.c inspect.txt)
