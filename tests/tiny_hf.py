"""Build a tiny Hugging Face model directory (random Qwen2 + word-level tokenizer + chat template)."""

from __future__ import annotations

from pathlib import Path

import torch

WORDS = ["def", "return", "if", "else", "for", "in", "x", "y", "(", ")", ":", "+", "=", "1", "2", "a", "b", "print"]
SPECIALS = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "user", "assistant", "\n"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tiny_hf_dir(path: Path, *, seed: int = 0, std: float = 0.5, noise_from: Path | None = None) -> Path:
    """A 2-layer Qwen2 over a ~25-token vocabulary. With `noise_from`, copy that model's weights plus noise
    (a draft that often agrees with the target)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {w: i for i, w in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins tokens with spaces
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|endoftext|>"],
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    cfg = Qwen2Config(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
        eos_token_id=vocab["<|im_end|>"], pad_token_id=vocab["<|endoftext|>"],
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        if noise_from is not None:
            base = Qwen2ForCausalLM.from_pretrained(str(noise_from), dtype=torch.float32)
            for p, b in zip(model.parameters(), base.parameters()):
                p.copy_(b + 0.1 * torch.randn_like(b))
        else:
            for name, p in model.named_parameters():
                p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else std * torch.randn_like(p))
    model.save_pretrained(str(path))
    hf_tok.save_pretrained(str(path))
    return path
