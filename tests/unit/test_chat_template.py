"""Chat templates render like Hugging Face's, inside a sandbox that fails cleanly."""

from __future__ import annotations

import pytest

from edge.errors import TemplateError
from edge.runtime.text.chat_template import PLAIN_TEMPLATE, ChatTemplate, load_template, strip_leading_bos

CHATML = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_renders_chatml_with_generation_prompt() -> None:
    t = ChatTemplate(CHATML, bos_token="<s>")
    out = t.render([{"role": "user", "content": "hi"}])
    assert out == "<s><|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert not t.render([{"role": "user", "content": "hi"}], add_generation_prompt=False).endswith(
        "assistant\n"
    )


def test_raise_exception_becomes_template_error() -> None:
    t = ChatTemplate("{% if messages[0]['role'] != 'user' %}{{ raise_exception('users first') }}{% endif %}")
    with pytest.raises(TemplateError, match="users first"):
        t.render([{"role": "assistant", "content": "x"}])


@pytest.mark.parametrize(
    "hostile",
    [
        "{{ messages.__class__.__mro__[1].__subclasses__() }}",
        "{{ raise_exception.__globals__['__builtins__'] }}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
        "{% set x = messages.append({'role': 'x'}) %}{{ x }}",
    ],
)
def test_sandbox_blocks_hostile_templates(hostile: str) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(TemplateError):
        ChatTemplate(hostile).render(msgs)
    assert msgs == [{"role": "user", "content": "hi"}]


def test_syntax_error_is_template_error() -> None:
    with pytest.raises(TemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")


def test_tojson_keeps_unicode_and_strftime_exists() -> None:
    t = ChatTemplate("{{ messages[0]['content'] | tojson }}|{{ strftime_now('%Y') | length }}")
    assert t.render([{"role": "user", "content": "héllo"}]) == '"héllo"|4'


def test_bad_messages_rejected() -> None:
    t = ChatTemplate(CHATML)
    with pytest.raises(TemplateError):
        t.render([])
    with pytest.raises(TemplateError):
        t.render([{"content": "no role"}])


def test_no_template_falls_back_to_plain_transcript() -> None:
    t = load_template(None, bos_token="<bos>")
    assert t.is_fallback and t.source == PLAIN_TEMPLATE
    out = t.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert out == "System: Be brief.\n\nUser: Hi\n\nAssistant:"


def test_strip_leading_bos() -> None:
    assert strip_leading_bos("<s>hi", "<s>") == ("hi", True)
    assert strip_leading_bos("hi", "<s>") == ("hi", False)
    assert strip_leading_bos("hi", "") == ("hi", False)
