#!/usr/bin/env bash
# Build (cached) a tiny harness around ggml's quantize_row_q*_K_ref, compiled from the llama.cpp
# sources that scripts/build-llama.sh fetches, with ggml-base's flags (-O3 -std=gnu11, no -march:
# the k-quant reference code runs without FMA), and print its path: `kq TYPE(2..6) in.f32 out.bin`.
# The oracle of tests/kquants_llama.rs's extreme rows (non-finite f16 scales, which llama-quantize
# refuses to write): scripts/test.sh sets TQ_KQ_GGML_REF to it. A few seconds once llama.cpp is there.
source "$(dirname "$0")/common.sh"
"$TQ_ROOT/scripts/build-llama.sh" >/dev/null
src="$TQ_CACHE/llama.cpp/src/ggml"
h="$TQ_CACHE/kq-ggml-ref"
mkdir -p "$h"
if [ ! -x "$h/kq" ]; then
  command -v cc >/dev/null || { echo "error: build-ggml-ref: no C compiler (cc)" >&2; exit 1; }
  cat > "$h/main.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
void quantize_row_q2_K_ref(const float *, void *, int64_t);
void quantize_row_q3_K_ref(const float *, void *, int64_t);
void quantize_row_q4_K_ref(const float *, void *, int64_t);
void quantize_row_q5_K_ref(const float *, void *, int64_t);
void quantize_row_q6_K_ref(const float *, void *, int64_t);
/* never reached from the *_ref functions; ggml-quants.o refers to them elsewhere */
void ggml_abort(const char * f, int l, const char * fmt, ...) { (void)f; (void)l; (void)fmt; abort(); }
size_t ggml_row_size(int t, int64_t n) { (void)t; (void)n; abort(); }
size_t ggml_type_size(int t) { (void)t; abort(); }
const char * ggml_type_name(int t) { (void)t; return "?"; }
/* kq TYPE(2..6) in.f32 out.bin: quantize whole 256-blocks of in.f32 with quantize_row_qTYPE_K_ref */
int main(int argc, char ** argv) {
  static const int bytes[7] = {0, 0, 84, 110, 144, 176, 210};
  if (argc != 4) { fprintf(stderr, "usage: kq TYPE in.f32 out.bin\n"); return 2; }
  int t = atoi(argv[1]);
  if (t < 2 || t > 6) return 2;
  FILE * f = fopen(argv[2], "rb");
  if (!f) return 1;
  fseek(f, 0, SEEK_END); long n = ftell(f) / 4; fseek(f, 0, SEEK_SET);
  float * x = malloc(n * 4);
  if (fread(x, 4, n, f) != (size_t)n) return 1;
  fclose(f);
  n -= n % 256;
  unsigned char * y = calloc(n / 256, bytes[t]);
  switch (t) {
    case 2: quantize_row_q2_K_ref(x, y, n); break;
    case 3: quantize_row_q3_K_ref(x, y, n); break;
    case 4: quantize_row_q4_K_ref(x, y, n); break;
    case 5: quantize_row_q5_K_ref(x, y, n); break;
    case 6: quantize_row_q6_K_ref(x, y, n); break;
  }
  f = fopen(argv[3], "wb");
  fwrite(y, bytes[t], n / 256, f);
  fclose(f);
  return 0;
}
C
  cc -O3 -DNDEBUG -std=gnu11 -D_GNU_SOURCE -D_XOPEN_SOURCE=600 -I"$src/src" -I"$src/include" \
    -c "$src/src/ggml-quants.c" -o "$h/ggml-quants.o"
  cc -O2 "$h/main.c" "$h/ggml-quants.o" -o "$h/kq" -lm
fi
echo "$h/kq"
