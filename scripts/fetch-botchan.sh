#!/usr/bin/env bash
# Fetch Botchan (Natsume Soseki, tr. Morri; public domain, Project Gutenberg #8868) — the text
# `tq eval` tests and CI score perplexity on. It ships as test/botchan.txt in the PyPI sdist
# sentencepiece==0.2.3; the Gutenberg header (first 13 lines) and footer are stripped.
# Prints the path of $TQ_CACHE/text/botchan.txt.
source "$(dirname "$0")/common.sh"
dst="$TQ_CACHE/text/botchan.txt"
if [ ! -f "$dst" ]; then
  mkdir -p "$TQ_CACHE/text"
  tmp=$(mktemp -d)
  pip download -q --no-deps --no-binary sentencepiece --disable-pip-version-check -d "$tmp" sentencepiece==0.2.3 >&2
  sd="$tmp/sentencepiece-0.2.3.tar.gz"
  verify "$sd" 21618ad31f0453a1ebf5ec58defed99758d54af0b670546ecac639ddd8b86fbd
  tar -xzf "$sd" -C "$tmp" sentencepiece-0.2.3/test/botchan.txt
  raw="$tmp/sentencepiece-0.2.3/test/botchan.txt"
  verify "$raw" 464bd5300c24fce16fcc4555d4231a57632caae4d0090ad6aa92854a3b227ba7
  tail -n +14 "$raw" | sed '/^End of Project Gutenberg/,$d' > "$tmp/botchan.txt"
  verify "$tmp/botchan.txt" 1fdb6356aed2be1745ba508d59d0d0d659663f8eceadf18fc0e5586cb28040c8
  mv "$tmp/botchan.txt" "$dst"
  rm -rf "$tmp"
fi
echo "$dst"
