"""Fresh (untrained) EAGLE and Medusa drafters for random:.gpu/q15, for greedy-identity checks on the device."""
import sys
from pathlib import Path
from verispec.models.load import load
from verispec.models.eagle import EagleConfig, EagleDrafter
from verispec.models.medusa import MedusaConfig, MedusaHeads

out = Path(sys.argv[1])
t = load("random:.gpu/q15", dtype="float32", progress=False).model
head = t.lm_head.weight[:32000].detach().float()
EagleDrafter.fresh(EagleConfig.for_target(t, "random-q15", intermediate_size=2048, head_vocab=32000), t, head).save(out / "eagle")
MedusaHeads.fresh(MedusaConfig.for_target(t, "random-q15", heads=3, head_vocab=32000), t, head).save(out / "medusa")
print("drafters in", out)
