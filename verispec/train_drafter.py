"""Training a feature-level drafter (EAGLE, or Medusa heads) for a target on this machine, by self-distillation.

1. Features, once: the target (as it runs, e.g. w4a8) reads chunks of a corpus (by default the Python standard
   library's own source files, present on every machine) and its last-block outputs h_t are stored with the tokens
   in shards under OUT/features (bf16); for an EAGLE-3 drafter (`feature_layers`), its outputs after those first
   blocks before them, [..., (k + 1) H]. Resumable: finished shards are kept; the last shard is held out.
2. Training: the drafter predicts h_t+1 from the pairs (h_<=t, token_<=t+1), and with depth > 1 the next steps
   from its own predictions (EagleDrafter.train_unrolled), and is fitted to the target by EAGLE's loss, smooth-L1
   on the feature plus 0.1 x the cross-entropy of its head's distribution against the target's own (the same head
   on the true feature: self-distillation, no labels needed), with a time budget, checkpoints (OUT/train-state.pt)
   and resume. Validation: how often the drafter's first guess is the target's argmax, the acceptance of a greedy
   first draft token, and for an EAGLE drafter its next draft steps' given the earlier ones right.
   Medusa heads (medusa_losses) train on the same shards: head k at h_t is fitted to the target's own distribution
   of token t+2+k (its head on the true feature h_t+1+k), the deeper heads weighted less (0.8^k).
"""

from __future__ import annotations

import math
import sys
import sysconfig
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from verispec.models.eagle import EagleDrafter
from verispec.models.llama import LlamaModel, hf_block_to_native, hf_weight_files, last_block
from verispec.models.medusa import MedusaHeads

Log = Callable[[str], None]
Drafter = EagleDrafter | MedusaHeads
LossFn = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]  # (tokens, features) -> (loss, first-token agreement)


@dataclass(frozen=True)
class TrainSettings:
    seq_len: int = 256  # tokens a training sequence holds
    tokens: int = 120_000  # corpus tokens whose features are cached
    shard: int = 16  # sequences a feature shard holds
    batch: int = 4  # sequences a step trains on
    lr: float = 1e-3
    warmup: int = 30  # steps of linear warm-up
    # "cosine": lr decays to lr * MIN_LR over what is left of the budget when a run starts (or resumes); "constant"
    schedule: str = "cosine"
    budget_s: float = 30 * 60.0  # training seconds (features not counted)
    checkpoint_s: float = 300.0
    cls_weight: float = 0.1  # EAGLE's weight of the distribution loss beside the feature loss
    depth: int = 1  # EAGLE: draft steps each anchor is trained on, step n reading step n-1's prediction
    # (EAGLE-3's training-time test; 1 is teacher forcing alone); step n's loss weighs step_decay ** (n - 1)
    step_decay: float = 0.8
    seed: int = 0
    bf16: bool = False  # matmuls in bfloat16 under autocast (weights and optimizer stay float32): 1.9x faster a
    # step where the CPU has AVX-512 BF16 (emulated, and slower, elsewhere); a GPU's native too

    def __post_init__(self) -> None:
        if self.schedule not in ("cosine", "constant"):
            raise ValueError(f"unknown learning-rate schedule {self.schedule!r}: cosine or constant")


def stdlib_texts() -> Iterator[str]:
    """The Python standard library's .py sources in a fixed order (tests and vendored trees left out)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        if any(part in ("test", "tests", "idlelib", "site-packages", "lib2to3") for part in path.relative_to(root).parts):
            continue
        try:
            yield path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue


def suite_texts() -> Iterator[str]:
    from verispec.bench.suite import load_prompts

    for prompt in load_prompts("suite"):
        yield "\n\n".join(m["content"] for m in prompt.messages)


def code_requests() -> Iterator[str]:
    """Requests about the standard library's own public functions, in a fixed order, rotating through four
    shapes: write one from its signature and docstring, complete one from its first lines, explain one, rewrite
    one with type hints -- the shapes of the bench's code categories, none of its prompts."""
    import ast
    import textwrap

    shape = 0
    for text in stdlib_texts():
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        lines = text.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            assert node.end_lineno is not None
            body = lines[node.lineno - 1 : node.end_lineno]
            if not doc or not 4 <= len(body) <= 60:
                continue
            source = textwrap.dedent("\n".join(body))
            if shape == 0:
                summary = doc.split("\n\n")[0].replace("\n", " ")
                yield f"Write a Python function `{node.name}({ast.unparse(node.args)})`. {summary}"
            elif shape == 1:
                docstring_end = node.body[0].end_lineno or node.lineno
                head = textwrap.dedent("\n".join(lines[node.lineno - 1 : docstring_end]))
                yield f"Complete this Python function:\n\n```python\n{head}\n```"
            elif shape == 2:
                yield f"Explain what this Python function does:\n\n```python\n{source}\n```"
            else:
                yield f"Rewrite this function more clearly, with type hints:\n\n```python\n{source}\n```"
            shape = (shape + 1) % 4


def passages() -> Iterator[tuple[str, str]]:
    """Prose present on every machine, as (subject, passage of a few paragraphs): the standard library's module
    docstrings, then the language reference's topics (pydoc_data), in a fixed order."""
    import ast

    def pieces(subject: str, text: str) -> Iterator[tuple[str, str]]:
        paras = [p.strip() for p in text.split("\n\n") if len(p.strip()) > 40 and not p.lstrip().startswith(">>>")]
        block: list[str] = []
        for para in paras:
            block.append(para)
            if sum(map(len, block)) >= 600:
                yield subject, "\n\n".join(block)[:1800]
                block = []
        if sum(map(len, block)) >= 300:
            yield subject, "\n\n".join(block)

    for text in stdlib_texts():
        try:
            doc = ast.get_docstring(ast.parse(text))
        except (SyntaxError, ValueError):
            continue
        if doc:
            name = doc.splitlines()[0].strip().rstrip(".")
            yield from pieces(name if len(name) < 80 else "this module", doc)
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions leave the reference out
        return
    for key in sorted(topics):
        title = topics[key].splitlines()[0].strip() or key
        yield from pieces(title, topics[key].split("\n", 2)[-1])


_LANGUAGES = ("French", "German", "Spanish", "Italian", "Portuguese")
_RAG_QUESTIONS = ("What is the main purpose of what the passage describes?",
                  "Which special cases or restrictions does the passage mention, and why do they matter?",
                  "Which terms does the passage define, and how would you explain each to a newcomer?",
                  "What should a reader do first, according to the passage, and what could go wrong?")
_FOLLOW_UPS = ("Can you give me a short example and explain it line by line?",
               "What mistakes do people commonly make with this, and how do I avoid them?",
               "How does this compare with the alternatives? When would I choose each?")


def math_problem(i: int) -> str:
    """A word problem with numbers from a seeded generator (request i always gets the same one)."""
    import random

    r = random.Random(i)
    a, b, c = r.randint(2, 95), r.randint(2, 95), r.randint(2, 12)
    shapes = (
        f"Two cyclists start {a * 3} km apart and ride toward each other at {b % 30 + 10} km/h and "
        f"{a % 25 + 8} km/h. When and where do they meet?",
        f"A shop sells a jacket for ${a + 40}. It is discounted by {c * 5}% and then a tax of {b % 12 + 3}% is "
        f"added. What is the final price, and what single percentage change is that?",
        f"A tank holds {a * 10} litres. One pipe fills it in {c + 2} hours and another empties it in {c + 7} hours. "
        f"Starting empty with both open, how long until it is full?",
        f"${a * 100} is invested at {c % 7 + 2}% interest compounded yearly. How much is there after {b % 9 + 2} "
        f"years, and how long until the amount doubles?",
        f"A rectangle's length is {c} cm more than its width and its area is {(b % 20 + 3) * (b % 20 + 3 + c)} "
        f"square cm. Find its dimensions and its perimeter.",
        f"In a class of {a + 20} students, {b % 60 + 20}% passed the first test and {c * 6}% of those who passed "
        f"also passed the second. How many passed both?",
    )
    return shapes[i % len(shapes)] + " Show your reasoning step by step."


def chat_requests() -> Iterator[list[dict[str, str]]]:
    """Conversations in the shapes of the bench's other categories -- summarize, translate, answer from a
    passage, explain, solve a word problem, a follow-up turn -- over prose found on every machine (`passages`),
    none of the bench's own prompts. Three passes, each passage in a different shape each time."""
    found: list[tuple[str, str]] = []
    for p in passages():  # the first pass as the passages are found: a few requests need no parse of the library
        found.append(p)
        yield _chat_request(len(found) - 1, 0, *p)
    for k in (1, 2):
        for j, p in enumerate(found):
            yield _chat_request(k * len(found) + j, k, *p)


def _chat_request(i: int, k: int, subject: str, passage: str) -> list[dict[str, str]]:
    """Request i (pass k) over one passage."""
    shape = (i + k) % 6
    if shape == 0:
        text = (f"Summarize the following passage in one paragraph of three to five sentences. Then list the two "
                f"most important points it makes.\n\n{passage}")
    elif shape == 1:
        text = (f"Translate the following text into {_LANGUAGES[i // 6 % len(_LANGUAGES)]}. Keep the technical "
                f"terms accurate and the tone unchanged.\n\n{passage[:700]}")
    elif shape == 2:
        text = (f"Answer the question using only the passage below, and quote the sentences you rely on.\n\n"
                f"Question: {_RAG_QUESTIONS[i // 6 % len(_RAG_QUESTIONS)]}\n\nPassage:\n{passage}")
    elif shape == 3:
        text = f"Explain, for someone new to Python, what this is about and why it exists: {subject}."
    elif shape == 4:
        text = math_problem(i // 6)
    else:
        return [{"role": "user", "content": f"What is this about: {subject}?"},
                {"role": "assistant", "content": passage.split("\n\n")[0]},
                {"role": "user", "content": _FOLLOW_UPS[i // 6 % len(_FOLLOW_UPS)]}]
    return [{"role": "user", "content": text}]


def keyed(streams: Mapping[str, Iterable[list[int]]],
          keep: Callable[[str, list[int]], bool]) -> Iterator[tuple[str, list[int]]]:
    """Round-robin over named request streams, each request keyed "name:index" (stable whatever the other
    streams), taking from each stream only the requests `keep` accepts, so that a stream whose first requests a
    resumed run skips does not lose its turns."""
    def kept(name: str, stream: Iterable[list[int]]) -> Iterator[tuple[str, list[int]]]:
        return ((f"{name}:{i}", r) for i, r in enumerate(stream) if keep(f"{name}:{i}", r))

    its = {name: kept(name, stream) for name, stream in streams.items()}
    while its:
        for name in list(its):
            nxt = next(its[name], None)
            if nxt is None:
                del its[name]
            else:
                yield nxt


def answer_features(target: LlamaModel, streams: Mapping[str, Iterable[list[int]]], out: Path,
                    settings: TrainSettings, *, eos_ids: tuple[int, ...], rows: int = 8, max_new_tokens: int = 256,
                    progress: bool = True) -> list[Path]:
    """The target answers each request (chat-formatted token ids; named streams taken in turn, see `keyed`),
    greedily, `rows` at a time, and its features come from those same forwards -- the prompt's prefill and each
    decoding step -- so the drafter learns the target's own answers at no second pass. Prompt and answer,
    concatenated request after request, fill the shards `cache_features` writes. Resumable: out/answers.json keys
    the requests already in finished shards (bare numbers, from before there were several streams, are the code
    requests')."""
    import json

    from safetensors.torch import save_file
    from tqdm import tqdm

    from verispec.engine import Batch, GenerationParams

    out.mkdir(parents=True, exist_ok=True)
    shards = _shard_paths(out, settings)
    have = next((i for i, p in enumerate(shards) if not p.is_file()), len(shards))
    if have == len(shards):
        return shards
    state = out / "answers.json"
    done = {k if isinstance(k, str) else f"answers:{k}" for k in json.loads(state.read_text())["done"]} \
        if state.is_file() and have else set()
    per_shard = settings.shard * settings.seq_len
    bar = tqdm(total=len(shards) * per_shard, unit="tok", desc="target answers and features", disable=not progress,
               initial=have * per_shard)
    max_len = min(1024 + max_new_tokens, target.cfg.max_position_embeddings)
    max_prompt = max_len - max_new_tokens  # longer requests are skipped
    if max_prompt < 2:
        raise ValueError(f"--max-new-tokens {max_new_tokens} leaves no room for a request in the target's context")
    batch = Batch(target, rows, max_len, slack=2)
    params = GenerationParams(max_new_tokens=max_new_tokens, eos_ids=eos_ids)
    todo = keyed(streams, lambda k, r: k not in done and 1 < len(r) <= max_prompt)
    live: dict[int, tuple[str, list[Tensor]]] = {}  # id(sequence) -> (request key, its features so far)
    tokens: list[int] = []
    feats: list[Tensor] = []
    owners: list[tuple[str, int]] = []  # (request key, its tokens still in the buffer), in buffer order
    while have < len(shards):
        while len(batch.live) < rows and (nxt := next(todo, None)) is not None:
            key, prompt = nxt
            seq = batch.add(prompt, params)
            live[id(seq)] = (key, [seq.prefill_hidden])
        if not batch.live:
            raise ValueError(f"the requests ran out after {have} of {len(shards)} shards: ask for fewer --tokens")
        for step in batch.round():
            key, got = live[id(step.seq)]
            if step.hidden is not None:
                got.append(step.hidden)
            if step.seq.result.finish_reason is None:
                continue
            del live[id(step.seq)]
            seq_tokens = step.seq.prompt + step.seq.out
            seq_feats = torch.cat(got).to("cpu", torch.bfloat16)
            n = min(len(seq_tokens), len(seq_feats))  # the last token emitted was never forwarded
            tokens += seq_tokens[:n]
            feats.append(seq_feats[:n])
            owners.append((key, n))
            bar.update(n)
        while len(tokens) >= per_shard and have < len(shards):
            flat = torch.cat(feats)
            path, tmp = shards[have], shards[have].with_suffix(".tmp")
            save_file({"tokens": torch.tensor(tokens[:per_shard], dtype=torch.int32).view(settings.shard, -1),
                       "features": flat[:per_shard].reshape(settings.shard, settings.seq_len, -1).contiguous()},
                      str(tmp))
            tmp.replace(path)
            have += 1
            tokens, feats = tokens[per_shard:], [flat[per_shard:]]
            used = per_shard
            while owners and owners[0][1] <= used:  # requests wholly in written shards
                used -= owners[0][1]
                done.add(owners.pop(0)[0])
            if owners:
                owners[0] = (owners[0][0], owners[0][1] - used)
            state.write_text(json.dumps({"done": sorted(done)}))
    bar.close()
    return shards


def _shard_paths(out: Path, settings: TrainSettings) -> list[Path]:
    n_shards = settings.tokens // (settings.seq_len * settings.shard)
    if n_shards < 2:
        raise ValueError(f"--tokens {settings.tokens} makes fewer than 2 shards of {settings.shard} x {settings.seq_len}")
    return [out / f"shard-{i:05d}.safetensors" for i in range(n_shards)]


def chunks(texts: Iterator[str], encode: Callable[[str], list[int]], seq_len: int, total: int) -> Iterator[list[int]]:
    """Consecutive seq_len-token pieces of the concatenated texts, `total` tokens in all."""
    buf: list[int] = []
    made = 0
    for text in texts:
        buf.extend(encode(text))
        while len(buf) >= seq_len and made + seq_len <= total:
            yield buf[:seq_len]
            buf = buf[seq_len:]
            made += seq_len
        if made + seq_len > total:
            return


def cache_features(target: LlamaModel, pieces: Iterator[list[int]], out: Path, settings: TrainSettings,
                   progress: bool = True) -> list[Path]:
    """Write the target's features for every piece into shards out/shard-NNNNN.safetensors (kept if present)."""
    from safetensors.torch import save_file
    from tqdm import tqdm

    out.mkdir(parents=True, exist_ok=True)
    shards = _shard_paths(out, settings)
    n_shards = len(shards)
    todo = [p for p in shards if not p.is_file()]
    bar = tqdm(total=n_shards * settings.shard * settings.seq_len, unit="tok", desc="target features",
               disable=not progress, initial=(n_shards - len(todo)) * settings.shard * settings.seq_len)
    cache = target.new_cache(settings.seq_len + 1)
    group: list[list[int]] = []
    index = 0
    for piece in pieces:
        group.append(piece)
        if len(group) < settings.shard:
            continue
        path = shards[index]
        index += 1
        if path.is_file():
            group = []
            if index == n_shards:
                break
            continue
        feats = []
        for seq in group:
            cache.reset()
            _, h = target.forward(torch.tensor([seq], device=target.device), cache, last_n=1, hidden=True)
            feats.append(h[0].to("cpu", torch.bfloat16))
            bar.update(len(seq))
        tmp = path.with_suffix(".tmp")
        save_file({"tokens": torch.tensor(group, dtype=torch.int32), "features": torch.stack(feats)}, str(tmp))
        tmp.replace(path)
        group = []
        if index == n_shards:
            break
    bar.close()
    missing = [p for p in shards if not p.is_file()]
    if missing:
        raise ValueError(f"the corpus ran out after {n_shards - len(missing)} of {n_shards} shards: ask for fewer --tokens")
    return shards


def losses(drafter: EagleDrafter, head: Tensor, tokens: Tensor, features: Tensor, cls_weight: float,
           depth: int = 1, step_decay: float = 0.8) -> tuple[Tensor, Tensor, Tensor]:
    """(loss, feature loss, agreement) of step 1: the drafter reads pairs (h_t, x_t+1) and predicts h_t+1; with
    depth > 1 also steps 2..depth from its own predictions (`EagleDrafter.train_unrolled`), each against the
    target's feature and distribution there, weighted step_decay ** (n - 1)."""
    preds = drafter.train_unrolled(tokens.long(), features.float(), depth)  # n-th: [B, T-n, H]
    last = last_block(features, drafter.eagle.hidden_size).float()
    with torch.no_grad():  # the target's distributions at positions 1.., which step n reads from n on
        teacher = F.linear(drafter.norm(last[:, 1:]), head)
        p = teacher.softmax(-1)
    total, first_reg, first_agree = features.new_zeros((), dtype=torch.float32), None, None
    for n, pred in enumerate(preds, start=1):
        reg = F.smooth_l1_loss(pred, last[:, n:])
        student = F.linear(drafter.norm(pred), head)  # [B, T-n, V']
        cls = -(p[:, n - 1 :] * student.log_softmax(-1)).sum(-1).mean()
        total = total + step_decay ** (n - 1) * (reg + cls_weight * cls)
        if n == 1:
            first_reg, first_agree = reg, (student.argmax(-1) == teacher.argmax(-1)).float().mean()
    assert first_reg is not None and first_agree is not None
    return total, first_reg, first_agree


VALIDATION_STEPS = 3  # draft steps whose agreement an EAGLE drafter's validation reports


def step_agreements(drafter: EagleDrafter, tokens: Tensor, features: Tensor, depth: int) -> list[float]:
    """How often draft step n's guess (n = 1..depth, each step reading the drafter's own previous one, the true
    tokens fed) is the target's argmax: a chain's acceptance at each position given the earlier ones accepted."""
    head = drafter.lm_head.weight
    with torch.no_grad():
        preds = drafter.train_unrolled(tokens.long(), features.float(), depth)
        last = last_block(features[:, 1:], drafter.eagle.hidden_size).float()
        teacher = F.linear(drafter.norm(last), head).argmax(-1)  # step n reads it from n on
        return [float((F.linear(drafter.norm(pred), head).argmax(-1) == teacher[:, n - 1 :]).float().mean())
                for n, pred in enumerate(preds, start=1)]


def medusa_losses(heads: MedusaHeads, head: Tensor, features: Tensor, decay: float = 0.8) -> tuple[Tensor, Tensor]:
    """(loss, head 0's agreement): head k at h_t against the target's distribution of token t+2+k, which is its
    own head on the true feature h_t+1+k; positions whose k-th target lies past the sequence are left out."""
    k_max = heads.medusa.heads
    t = features.shape[1] - 1 - k_max  # positions every head has a target for
    if t < 1:
        raise ValueError(f"sequences of {features.shape[1]} tokens are too short for {k_max} heads")
    student = heads(features[:, :t].float())  # [B, t, K, V']
    with torch.no_grad():
        teacher = F.linear(heads.norm(features[:, 1:].float()), head)  # [B, T-1, V']: token s+2 from h_s+1
    loss = student.new_zeros(())
    for k in range(k_max):
        p = teacher[:, k : k + t].softmax(-1)
        loss = loss + decay**k * -(p * student[:, :, k].log_softmax(-1)).sum(-1).mean()
    agree = (student[:, :, 0].argmax(-1) == teacher[:, :t].argmax(-1)).float().mean()
    return loss, agree


def loss_fn(drafter: Drafter, settings: TrainSettings) -> LossFn:
    """The drafter's training loss over (tokens, features) batches, against its own (frozen) head rows."""
    head = drafter.lm_head.weight.detach()
    if isinstance(drafter, MedusaHeads):
        return lambda tokens, features: medusa_losses(drafter, head, features)

    def eagle(tokens: Tensor, features: Tensor) -> tuple[Tensor, Tensor]:
        loss, _, agree = losses(drafter, head, tokens, features, settings.cls_weight, settings.depth,
                                settings.step_decay)
        return loss, agree

    return eagle


MIN_LR = 0.05  # the cosine schedule's last learning rate, as a fraction of the peak


def learning_rate(settings: TrainSettings, step: int, progress: float) -> float:
    """The learning rate of a step: linear warm-up over the first steps, then by the schedule at `progress`, the
    fraction of this run's budget used (the budget is time, so the schedule is too)."""
    warm = min(1.0, (step + 1) / settings.warmup)
    if settings.schedule == "constant":
        return settings.lr * warm
    p = min(1.0, max(0.0, progress))
    return settings.lr * warm * (MIN_LR + (1.0 - MIN_LR) * 0.5 * (1.0 + math.cos(math.pi * p)))


def train(drafter: Drafter, shards: list[Path], out: Path, settings: TrainSettings,
          log: Log, progress: bool = True) -> dict[str, float]:
    """Fit the drafter's own weights on shards[:-1], validate on shards[-1]; save to `out` as it goes."""
    from safetensors.torch import load_file
    from tqdm import tqdm

    objective = loss_fn(drafter, settings)
    params = [p for n, p in drafter.named_parameters() if not n.startswith(("embed.", "norm.", "lm_head."))]
    for n, p in drafter.named_parameters():
        p.requires_grad_(not n.startswith(("embed.", "norm.", "lm_head.")))
    opt = torch.optim.AdamW(params, lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.0)
    state_path = out / "train-state.pt"
    step, used = 0, 0.0
    if state_path.is_file():
        state = torch.load(state_path, weights_only=False, map_location="cpu")  # whatever device saved it
        opt.load_state_dict(state["optimizer"])
        step, used = state["step"], state["seconds"]
        log(f"resuming at step {step} ({used / 60:.1f} of {settings.budget_s / 60:.1f} min used)")
    data = [load_file(str(p)) for p in shards[:-1]]
    val = load_file(str(shards[-1]))
    tokens = torch.cat([d["tokens"] for d in data])
    features = torch.cat([d["features"] for d in data])
    width = drafter.medusa.hidden_size if isinstance(drafter, MedusaHeads) else drafter.eagle.feature_width
    if features.shape[-1] != width or val["features"].shape[-1] != width:
        raise ValueError(f"the cached features in {shards[0].parent} are {features.shape[-1]} wide; this drafter reads "
                         f"{width} (its feature layers differ from theirs): give another --features directory")
    gen = torch.Generator().manual_seed(settings.seed + step)
    device = drafter.lm_head.weight.device  # the target's (a GPU's)

    def autocast() -> torch.autocast:
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=settings.bf16)

    def validate() -> list[float]:
        """Held-out agreement of the first guess, and of an EAGLE drafter's later draft steps."""
        drafter.eval()
        agree = []
        with torch.no_grad():
            for i in range(0, val["tokens"].shape[0], settings.batch):
                tok = val["tokens"][i : i + settings.batch].to(device)
                feat = val["features"][i : i + settings.batch].to(device)
                with autocast():
                    agree.append(step_agreements(drafter, tok, feat, VALIDATION_STEPS)
                                 if isinstance(drafter, EagleDrafter) else [float(objective(tok, feat)[1])])
        drafter.train()
        return [sum(a) / len(agree) for a in zip(*agree)]

    def shown(by_step: list[float]) -> str:
        return f"{by_step[0]:.3f}" + ("" if len(by_step) < 2 else f" (draft steps 2-{len(by_step)} after it: "
                                      + ", ".join(f"{a:.3f}" for a in by_step[1:]) + ")")

    first = validate()
    log(f"validation before training (step {step}): first-token agreement {shown(first)}")
    bar = tqdm(total=int(settings.budget_s), unit="s", desc="training", disable=not progress, initial=int(used))
    last_save, start = time.perf_counter(), time.perf_counter() - used
    first_used = used  # the schedule decays over what is left of the budget from here
    recent: list[float] = []
    drafter.train()
    while used < settings.budget_s:
        t0 = time.perf_counter()
        pick = torch.randint(0, tokens.shape[0], (settings.batch,), generator=gen)
        lr = learning_rate(settings, step, (used - first_used) / max(1e-9, settings.budget_s - first_used))
        for group in opt.param_groups:
            group["lr"] = lr
        with autocast():
            loss, agree = objective(tokens[pick].to(device), features[pick].to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()
        step += 1
        recent = (recent + [float(agree)])[-50:]
        now = time.perf_counter()
        used = now - start
        bar.update(int(used) - bar.n)
        if not math.isfinite(float(loss.detach())):
            raise FloatingPointError(f"the loss became {float(loss.detach())} at step {step}; try a smaller --lr")
        if step % 50 == 0:
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}", agree=f"{sum(recent) / len(recent):.3f}")
        if now - last_save >= settings.checkpoint_s or used >= settings.budget_s:
            score = validate()
            _checkpoint(drafter, opt, step, used, out)
            log(f"step {step}, {used / 60:.1f} min: train agreement {sum(recent) / len(recent):.3f}, "
                f"validation {shown(score)} (saved)")
            last_save = time.perf_counter()
            start += last_save - now  # validation and saving are not training time
    bar.close()
    score = validate()
    _checkpoint(drafter, opt, step, used, out)
    drafter.eval()
    return {"steps": step, "seconds": used, "validation_agreement": score[0], "initial_agreement": first[0],
            **{f"validation_agreement_step{n}": a for n, a in enumerate(score[1:], start=2)}}


def _checkpoint(drafter: Drafter, opt: torch.optim.Optimizer, step: int, used: float, out: Path) -> None:
    drafter.save(out)
    tmp = out / "train-state.pt.tmp"
    torch.save({"optimizer": opt.state_dict(), "step": step, "seconds": used}, tmp)
    tmp.replace(out / "train-state.pt")


def frequent_ids(shards: list[Path], rows: int, vocab_size: int) -> Tensor:
    """The `rows` ids most frequent in the shards' tokens, most frequent first (ties, and ids never seen, by id): the
    rows of a "frequent" EAGLE head (EagleConfig.head_order), the ids the drafter's own text uses."""
    from safetensors import safe_open

    counts = torch.zeros(vocab_size, dtype=torch.long)
    for shard in shards:
        with safe_open(str(shard), framework="pt", device="cpu") as f:  # the tokens alone, not the features
            counts += torch.bincount(f.get_tensor("tokens").flatten().long(), minlength=vocab_size)[:vocab_size]
    return torch.argsort(-counts, stable=True)[:rows]


def target_head(target: LlamaModel, directory: Path | None, rows: int, ids: Tensor | None = None) -> Tensor:
    """The target's LM head rows [rows, H] in float32 (the first `rows`, or those of `ids`): from its float weights,
    or from its model directory when the loaded model runs quantized (the kernel's packed codes are not read
    back)."""
    head = target.lm_head
    if isinstance(head, torch.nn.Linear) and head.weight.device.type != "meta":
        w = head.weight.detach()
        return (w[:rows] if ids is None else w[ids.to(w.device)]).float().clone()
    if directory is None:
        raise ValueError("the target's LM head is quantized and no model directory was given to read it from")
    from safetensors import safe_open

    files = hf_weight_files(directory)
    for name in ("lm_head.weight", "model.embed_tokens.weight"):  # a tied head is the embedding table
        for file in files:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                if name not in f.keys():
                    continue
                table = f.get_slice(name)
                if ids is None:
                    return table[:rows].float()
                out = torch.empty(len(ids), table.get_shape()[1])
                for start in range(0, table.get_shape()[0], 16384):  # a slice at a time: never the whole table
                    block = table[start : start + 16384]
                    inside = (ids >= start) & (ids < start + block.shape[0])
                    out[inside] = block[ids[inside] - start].float()
                return out
    raise ValueError(f"no LM head in {directory}")


def target_block(target: LlamaModel, directory: Path | None) -> dict[str, Tensor]:
    """The target's last block's weights in float32 by their names in a block (wqkv.weight, w13.weight, ...), for an
    EAGLE drafter's layer to start from: its own float weights, or from its model directory when it runs quantized."""
    last = target.layers[-1]
    if isinstance(last.wqkv, torch.nn.Linear) and last.wqkv.weight.device.type != "meta":
        return {name: p.detach().float().clone() for name, p in last.named_parameters()}
    if directory is None:
        raise ValueError("the target's blocks are quantized and no model directory was given to read them from")
    from safetensors import safe_open

    handles = [safe_open(str(f), framework="pt", device="cpu") for f in hf_weight_files(directory)]

    def get(name: str) -> Tensor:
        for f in handles:
            if name in f.keys():
                return f.get_tensor(name).float()
        raise ValueError(f"no {name} in {directory}")

    return hf_block_to_native(get, target.cfg, target.cfg.num_hidden_layers - 1)


def log_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
