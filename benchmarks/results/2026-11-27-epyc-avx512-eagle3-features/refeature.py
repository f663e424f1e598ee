"""Re-record the target's features over the token sequences of an existing feature cache, with EAGLE-3's feature
layers: the same 262,144 answer tokens (64 shards of 16 x 256) as the teacher-forced drafter of
2026-11-27-epyc-avx512-eagle-answers, so that two drafters can be trained on the same text, one reading the last
block's output alone, one its fusion with the outputs after the first 3 and 14 blocks.

    python refeature.py SRC_FEATURES_DIR OUT_DIR [3,14]
"""

import sys
from pathlib import Path

from safetensors.torch import load_file

from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET
from verispec.train_drafter import TrainSettings, cache_features


def main() -> None:
    src, out = Path(sys.argv[1]).expanduser(), Path(sys.argv[2]).expanduser()
    layers = tuple(int(k) for k in (sys.argv[3] if len(sys.argv) > 3 else "3,14").split(","))
    default_threads()
    target = load(DEFAULT_TARGET, dtype="w4a8")
    target.model.feature_layers = layers
    settings = TrainSettings(tokens=262_144)

    def pieces():
        for i in range(settings.tokens // (settings.shard * settings.seq_len)):
            for row in load_file(str(src / f"shard-{i:05d}.safetensors"))["tokens"].tolist():
                yield row

    cache_features(target.model, pieces(), out, settings, progress=True)


if __name__ == "__main__":
    main()
