"""A tiny Llama for tests: seeded random weights and a BPE tokenizer trained here.

Built in about a second with no download, and byte-identical on every run (same library
versions), so tests can compare engines token for token. The weights are random: the text
it writes is nonsense, but greedy decoding is deterministic and exercises the real code.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ._common import (
    make_temp_dir,
    normalize_modes,
    publish,
    read_marker,
    tidy_tokenizer_config,
    write_marker,
)

VERSION = 1

BOS_EOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [BOS_EOS, IM_START, IM_END]
VOCAB_SIZE = 1024  # an upper bound: the small corpus yields fewer merges, which is fine
MAX_LEN = 2048

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_PARAGRAPHS = """\
The capital of France is Paris. The capital of Germany is Berlin, and the capital of Italy is Rome.
Paris lies on the river Seine; Berlin lies on the Spree; Rome lies on the Tiber.
Once upon a time there was a small cat who lived in a quiet house at the end of a long road.
Every morning the cat sat by the window and watched the birds in the garden. The birds sang,
the sun rose over the hills, and the people of the town went to work.
A language model reads a prompt, turns it into tokens, and predicts the next token, one at a time.
The prefill step computes the keys and values for every token of the prompt; the decode step
then produces new tokens, reusing the cache. Splitting the two lets each run on its own machine.
What is the weather like today? It is sunny and warm, with a light wind from the west.
Tomorrow it may rain, so take an umbrella when you go out. In winter the days are short and cold;
in summer they are long and bright.
Please write a short poem about the sea. The sea is wide, the sea is deep, it sings the sailors
all to sleep. Waves come in and waves go out, and that is what the tide is all about.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 20 42 100 256 1000 2048 8192. Two plus two is four.
Ten times ten is one hundred. Half of eight is four, and a third of nine is three.
Questions and answers: Who wrote the letter? She did. Where is the station? Near the bridge.
When does the train leave? At half past seven. Why is the sky blue? Because air scatters blue light
more than red light. How are you? I am fine, thank you, and you?
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
Sphinx of black quartz, judge my vow. How vexingly quick daft zebras jump!
A good test is small, fast and deterministic; it checks behaviour, not timings.
The server accepts a request, checks the key, counts the tokens, and sends the answer back
as a stream of events. If it is too busy, it says so and asks the client to retry later.
Hello, world! "Quotes", (parentheses), [brackets], {braces}, a-b, a_b, a/b, 50%, $5, #1, @home.
"""

_SUBJECTS = ["the teacher", "a farmer", "my friend", "the old man", "a young girl", "the robot"]
_VERBS = ["reads", "writes", "finds", "carries", "opens", "paints", "builds", "likes"]
_OBJECTS = ["a book", "the door", "a letter", "the red box", "a small boat", "the map", "a song"]
_PLACES = ["in the morning", "at home", "near the river", "after lunch", "in the city", "today"]


def training_corpus() -> list[str]:
    """A few KB of fixed English text: the paragraphs above plus generated simple sentences."""
    lines = [line for line in _PARAGRAPHS.splitlines() if line.strip()]
    # Deterministic combinations (no RNG): every subject/verb/object once, places cycled.
    i = 0
    for s in _SUBJECTS:
        for v in _VERBS:
            for o in _OBJECTS[: 1 + (i % 3)]:
                p = _PLACES[i % len(_PLACES)]
                lines.append(f"{s.capitalize()} {v} {o} {p}.")
                i += 1
    return lines


def _build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte: any text encodes
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_EOS,
        eos_token=BOS_EOS,
        unk_token=BOS_EOS,
        pad_token=BOS_EOS,
        model_max_length=MAX_LEN,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def _build_model(vocab_size: int, bos_id: int, eos_id: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_LEN,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    # Explicit init from our own generator, in sorted name order: independent of how a
    # transformers release initializes (or skips initializing) weights.
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif param.ndim == 1:
                param.zero_()
            else:
                param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float32) * 0.02)
    model.eval()
    return model


def make_tiny_llama(dest: Path) -> Path:
    """Create (once) a tiny random Llama with its tokenizer in `dest`; return `dest`."""
    dest = Path(dest)
    info = {"kind": "tiny-llama", "version": VERSION}
    if read_marker(dest) == info:
        return dest

    from transformers import GenerationConfig

    tmp = make_temp_dir(dest)
    try:
        tokenizer = _build_tokenizer()
        bos_id = tokenizer.convert_tokens_to_ids(BOS_EOS)
        model = _build_model(len(tokenizer), bos_id, bos_id)
        model.generation_config = GenerationConfig(
            bos_token_id=bos_id, eos_token_id=bos_id, pad_token_id=bos_id
        )
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        tidy_tokenizer_config(tmp)
        normalize_modes(tmp)
        write_marker(tmp, info)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if dest.exists() and read_marker(dest) is not None:
        # An older version of the tiny model: replace it (it is ours, marked).
        shutil.rmtree(dest)
    return publish(tmp, dest)
