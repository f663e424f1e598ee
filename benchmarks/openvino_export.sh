#!/usr/bin/env bash
# Export the default pair for `verispec bench --peers openvino`, once per machine: optimum-intel's int4 weight
# compression (its defaults: int4 asymmetric, groups of 128; embeddings and head int8) of the same converted
# checkpoints verispec runs, into <verispec cache>/openvino/NAME-int4.
#
#     bash benchmarks/openvino_export.sh            # ~1 min for the draft, ~2 min for the target on 2 cores
#
# optimum-intel 2.2 needs transformers < 5.6, older than verispec's, so it runs in an environment of its own
# ($OV_EXPORT_ENV, default <verispec cache>/openvino/export-env, ~1.5 GB). The peer itself needs only the
# [openvino] extra (openvino-genai) beside verispec.
set -euo pipefail
PY=${PYTHON:-.venv/bin/python}
OUT=$("$PY" -c "from verispec.models.files import cache_dir; print(cache_dir() / 'openvino')")
ENV=${OV_EXPORT_ENV:-$OUT/export-env}
if [ ! -x "$ENV/bin/optimum-cli" ]; then
  python3 -m venv "$ENV"
  "$ENV/bin/pip" install -q "torch==2.13.0" "optimum-intel[openvino]==2.2.0" "transformers<5.6"
  "$ENV/bin/pip" uninstall -y -q torchvision  # built for another torch: transformers' import of it fails
fi
for name in ${MODELS:-qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct}; do
  [ -f "$OUT/$name-int4/openvino_model.xml" ] && { echo "$OUT/$name-int4: there already"; continue; }
  src=$("$PY" -c "import sys; from verispec.models.load import resolve; print(resolve(sys.argv[1]))" "$name")
  tmp=$(mktemp -d)  # the checkpoint's own files only (not verispec's quantized caches beside them)
  for f in config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json chat_template.jinja; do
    [ -e "$src/$f" ] && ln -s "$src/$f" "$tmp/$f"
  done
  "$ENV/bin/optimum-cli" export openvino --model "$tmp" --task text-generation-with-past --weight-format int4 "$OUT/$name-int4"
  rm -r "$tmp"
done
