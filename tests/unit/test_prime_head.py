"""The chat template's head (runtime/llama/prime.py `chat_head`): exactly the tokens every chat of
one user message starts with, as a chat request tokenizes its rendered prompt."""

from __future__ import annotations

from edge.runtime.llama.prime import HEAD_MAX_TOKENS, MIN_HEAD_TOKENS, chat_head
from edge.runtime.text.chat_template import ChatTemplate, load_template

SYSTEM = "You are a helpful assistant."
CHATML = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\n" + SYSTEM + "<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class _Model:
    """A tokenizer of one token per character; `add_bos` as the GGUF says."""

    def __init__(self, add_bos: bool = False) -> None:
        self.add_bos = add_bos

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        assert not add_bos, "a rendered chat is tokenized without adding a BOS (engine render_chat)"
        return [ord(c) for c in text]


def _tokens(template: ChatTemplate, model: _Model, text: str) -> list[int]:
    return model.tokenize(template.prompt([{"role": "user", "content": text}], model.add_bos), add_bos=False)


def test_the_head_is_the_default_system_prompt_and_the_user_turn_marker() -> None:
    template, model = ChatTemplate(CHATML), _Model()
    head = chat_head(template, model)
    assert "".join(map(chr, head)) == f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
    for text in ("Say hi.", "Hello", "", "1 + 1 = ?", "<|im_start|>"):
        assert tuple(_tokens(template, model, text)[:len(head)]) == head


def test_a_model_that_wants_a_bos_has_it_in_its_head() -> None:
    template, model = ChatTemplate(CHATML, bos_token="<s>"), _Model(add_bos=True)
    head = chat_head(template, model)
    assert "".join(map(chr, head)).startswith("<s><|im_start|>system\n")
    assert tuple(_tokens(template, model, "anything")[:len(head)]) == head


def test_no_head_for_the_plain_fallback_a_short_one_or_a_template_that_fails() -> None:
    assert chat_head(load_template(None), _Model()) == ()  # a model without a template
    assert chat_head(ChatTemplate("{{ messages[0]['content'] }}"), _Model()) == ()  # nothing shared
    short = ChatTemplate("A" * (MIN_HEAD_TOKENS - 1) + "{{ messages[0]['content'] }}")
    assert chat_head(short, _Model()) == ()
    failing = ChatTemplate("{{ raise_exception('no') }}")
    assert chat_head(failing, _Model()) == ()


def test_a_long_system_prompt_is_primed_up_to_the_cap() -> None:
    long = ChatTemplate("S" * (HEAD_MAX_TOKENS * 2) + "{{ messages[0]['content'] }}")
    assert chat_head(long, _Model()) == (ord("S"),) * HEAD_MAX_TOKENS
