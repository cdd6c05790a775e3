#!/usr/bin/env bash
# Runs each libFuzzer target (fuzz/) for SECONDS (default 30), seeded from the repository's
# own files, and fails on the first crash, hang (over 10 s for one input), or resident memory
# over 2 GiB. A failing input is written to target/fuzz/artifacts/.
#
#   bash .ci/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"
target_dir="${CARGO_TARGET_DIR:-target}"

RUSTC_WORKSPACE_WRAPPER="$PWD/.ci/sancov-rustc" cargo build --locked -p smolchat-fuzz --bins

work="$target_dir/fuzz"
mkdir -p "$work/artifacts" "$work/seeds/gguf_parse" "$work/seeds/server_request"
# The real model's head: its metadata and first tensors' headers.
head -c 16384 tests/models/SmolLM2-135M-Instruct.Q4_1.gguf >"$work/seeds/gguf_parse/smollm2-head.gguf"
cp fuzz/seeds/server_request/* "$work/seeds/server_request/"
declare -A seeds=(
  [gguf_parse]="$work/seeds/gguf_parse"
  [server_request]="$work/seeds/server_request"
  [chat_template]="tests/fixtures/templates"
)
for target in gguf_parse server_request chat_template; do
  corpus="$work/corpus/$target"
  mkdir -p "$corpus"
  echo "fuzzing $target for $seconds s"
  "$target_dir/debug/$target" "$corpus" "${seeds[$target]}" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$work/artifacts/$target-" 2>&1 |
    grep -E '^(#[0-9]+ *DONE|==|ERROR|SUMMARY|stat::number_of_executed_units|INFO: seed corpus)|panicked' || true
  # libFuzzer's exit status is lost in the pipe above; a finding leaves an artifact.
  if compgen -G "$work/artifacts/$target-*" >/dev/null; then
    echo "fuzz target $target found a failing input: $(ls "$work/artifacts/$target-"*)"
    exit 1
  fi
done
