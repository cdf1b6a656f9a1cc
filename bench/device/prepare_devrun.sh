#!/usr/bin/env bash
# Build .devrun, the folder every device call carries (bench/device/README.md; ignored by git): the default model's
# tokenizer (`make model` first), the dev reviews, and the wheels the GPU image lacks for the service (Python 3.12,
# x86_64; mysql-connector-python as its pure-Python wheel, 0.5 MB against 21 MB, so that the folder, the tree and
# the kit's last part fit one call's 64 MiB).   bash bench/device/prepare_devrun.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
model=.cache/models/qwen2.5-coder-0.5b-instruct
[ -f $model/tokenizer.json ] || { echo "no $model/tokenizer.json: run make model first" >&2; exit 1; }
mkdir -p .devrun/tok .devrun/whl
cp $model/tokenizer.json $model/tokenizer_config.json $model/chat_template.jinja .devrun/tok/
cp ../shared/data/hotel_reviews/reviews_dev.csv .devrun/
wheels() { PIP_CONSTRAINT= python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp -d .devrun/whl "$@"; }
wheels --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 --platform any \
  prometheus_client httpx httpcore h11 anyio sniffio py-spy
wheels --platform any mysql-connector-python
du -sh .devrun
