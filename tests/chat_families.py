"""Chat-template fixtures of the model families people fine-tune, each written for these tests from the
family's documented prompt format (model cards and format guides), not copied from a repository, with a tiny
byte-level BPE tokenizer that holds the family's special tokens. A module with a unique name, so test files in
any folder can import it.

Each :class:`Family` says what the template does by default: ``refusal`` (a phrase of the one-line data-check
fault, and the key it names) or None (it works by default), and ``fix`` (the study keys that make it work).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CORPUS = [
    "add the piano bar to my Cindy Wilson playlist",
    "book a table for two in Paris tonight",
    "what is the weather in Rome tomorrow",
    '{"intent": "PlayMusic", "slots": {"artist": "Abba"}}',
    '{"intent": "BookRestaurant", "slots": {"city": "Paris"}}',
    '{"intent": "GetWeather", "slots": {}}',
    "Reply with JSON only.",
    "system user assistant model developer final analysis",
]

# Llama 3.1: a system header with a fixed knowledge cutoff and date_string (default a fixed day)
LLAMA_3 = (
    "{{ bos_token }}{% if date_string is not defined %}{% set date_string = '26 Jul 2024' %}{% endif %}"
    "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
    "Today Date: {{ date_string }}\n\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] | trim }}{% endif %}<|eot_id|>"
    "{% for m in messages %}{% if m['role'] != 'system' %}"
    "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# Llama 3.2: the same, but the date is today's unless date_string is given
LLAMA_32 = LLAMA_3.replace("'26 Jul 2024'", "strftime_now('%d %b %Y')")

QWEN25 = (
    "{% if messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n"
    "{% else %}<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    "{% endif %}{% for m in messages %}{% if m['role'] != 'system' %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Qwen3: the last assistant turn carries a think block (empty without reasoning); enable_thinking false puts the
# empty block into the generation prompt instead
QWEN3 = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}<|im_start|>assistant\n"
    "{% if loop.last %}<think>\n{{ (m['reasoning_content'] if m['reasoning_content'] is defined else '') }}"
    "\n</think>\n\n{% endif %}{{ m['content'] }}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
# DeepSeek-R1 distills: reasoning before </think> is cut from assistant turns; the generation prompt opens <think>
R1 = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}<\uff5cUser\uff5c>{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}{% set c = m['content'] %}"
    "{% if '</think>' in c %}{% set c = c.split('</think>')[-1] %}{% endif %}"
    "<\uff5cAssistant\uff5c>{{ c }}<\uff5cend\u2581of\u2581sentence\uff5c>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<\uff5cAssistant\uff5c><think>\n{% endif %}"
)
R1_NO_OPEN_THINK = R1.replace("<\uff5cAssistant\uff5c><think>\n{% endif %}", "<\uff5cAssistant\uff5c>{% endif %}")
# Gemma 2: no system role (the template raises), assistant is 'model', turns end with <end_of_turn>
GEMMA2 = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for m in messages %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "<start_of_turn>{{ role }}\n{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
# Gemma 3: the system text is put at the head of the first user turn by the template itself
GEMMA3 = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{% set prefix = messages[0]['content'] + '\n\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set prefix = '' %}{% set turns = messages %}{% endif %}"
    "{% for m in turns %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "<start_of_turn>{{ role }}\n{{ (prefix if loop.first else '') + (m['content'] | trim) }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
# Mistral v0.3: [INST] turns, the system text only with the last user turn, answers end with eos
MISTRAL = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set system_message = messages[0]['content'] %}"
    "{% set turns = messages[1:] %}{% else %}{% set turns = messages %}{% endif %}"
    "{% for m in turns %}{% if m['role'] == 'user' %}"
    "{% if loop.last and system_message is defined %}[INST] {{ system_message + '\n\n' + m['content'] }}[/INST]"
    "{% else %}[INST] {{ m['content'] }}[/INST]{% endif %}"
    "{% elif m['role'] == 'assistant' %} {{ m['content'] | trim }}{{ eos_token }}{% endif %}{% endfor %}"
)
PHI3 = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% else %}{{ eos_token }}{% endif %}"
)
# harmony (gpt-oss): a system header with today's date, the study's system text as developer instructions, the
# answer in the final channel, the last assistant message ended by <|return|>
HARMONY = (
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\nCurrent date: {{ strftime_now('%Y-%m-%d') }}\n\nReasoning: medium\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "<|start|>developer<|message|># Instructions\n\n{{ m['content'] }}<|end|>"
    "{% elif m['role'] == 'user' %}<|start|>user<|message|>{{ m['content'] }}<|end|>"
    "{% elif m['role'] == 'assistant' %}<|start|>assistant<|channel|>final<|message|>{{ m['content'] }}"
    "{% if loop.last %}<|return|>{% else %}<|end|>{% endif %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)
# SmolLM3: a metadata system block with today's date and the reasoning mode (/think by default)
SMOLLM3 = (
    "<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\n"
    "Today Date: {{ strftime_now('%d %B %Y') }}\n"
    "Reasoning Mode: {{ '/no_think' if (enable_thinking is defined and enable_thinking is false) else '/think' }}"
    "\n\n## Custom Instructions\n\n{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% endif %}"
    "<|im_end|>\n{% for m in messages %}{% if m['role'] == 'user' %}<|im_start|>user\n{{ m['content'] }}<|im_end|>\n"
    "{% elif m['role'] == 'assistant' %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n{% endif %}"
    "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n{% endif %}{% endif %}"
)

# Phi-4: ChatML turns whose role is closed by <|im_sep|> instead of a newline
PHI4 = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}<|im_sep|>{{ m['content'] }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant<|im_sep|>{% endif %}"
)
# Granite 3.x: role markers, every turn ended by <|end_of_text|> (the eos itself); without a system message the
# template writes its own, with today's date
GRANITE3 = (
    "{% if messages[0]['role'] == 'system' %}{% set system_message = messages[0]['content'] %}"
    "{% set turns = messages[1:] %}{% else %}"
    "{% set system_message = 'Knowledge Cutoff Date: April 2024.\nToday\\'s Date: ' + strftime_now('%B %d, %Y') + "
    "'.\nYou are Granite, developed by IBM.' %}{% set turns = messages %}{% endif %}"
    "<|start_of_role|>system<|end_of_role|>{{ system_message }}<|end_of_text|>\n"
    "{% for m in turns %}<|start_of_role|>{{ m['role'] }}<|end_of_role|>{{ m['content'] }}<|end_of_text|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|start_of_role|>assistant<|end_of_role|>{% endif %}"
)
# Command-R: the BOS token in the text, one role token per turn, turns ended by <|END_OF_TURN_TOKEN|> (the eos)
COMMAND_R = (
    "{{ bos_token }}{% for m in messages %}<|START_OF_TURN_TOKEN|>"
    "{% if m['role'] == 'system' %}<|SYSTEM_TOKEN|>{% elif m['role'] == 'user' %}<|USER_TOKEN|>"
    "{% else %}<|CHATBOT_TOKEN|>{% endif %}{{ m['content'] }}<|END_OF_TURN_TOKEN|>{% endfor %}"
    "{% if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% endif %}"
)
# OLMo-2 / Tulu 3: plain-text role markers, an answer ended by the eos <|endoftext|> (also the bos)
OLMO2 = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}<|system|>\n{{ m['content'] }}\n"
    "{% elif m['role'] == 'user' %}<|user|>\n{{ m['content'] }}\n"
    "{% elif m['role'] == 'assistant' %}<|assistant|>\n{{ m['content'] }}{{ eos_token }}"
    "{% if not loop.last %}\n{% endif %}{% endif %}"
    "{% if loop.last and add_generation_prompt %}<|assistant|>\n{% endif %}{% endfor %}"
)
# Llama-2 chat: the system text inside the first [INST] between <<SYS>> markers, every user turn opened by the BOS,
# answers ended by the eos; roles must alternate; no generation prompt (the prompt ends with [/INST] anyway)
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] %}{% set turns = messages[1:] %}"
    "{% else %}{% set sys = none %}{% set turns = messages %}{% endif %}"
    "{% for m in turns %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and sys is not none %}{% set text = '<<SYS>>\n' + sys + '\n<</SYS>>\n\n' + m['content'] %}"
    "{% else %}{% set text = m['content'] %}{% endif %}"
    "{% if m['role'] == 'user' %}{{ bos_token + '[INST] ' + text | trim + ' [/INST]' }}"
    "{% else %}{{ ' ' + text | trim + ' ' + eos_token }}{% endif %}{% endfor %}"
)
# DeepSeek-V3: the system text right after the BOS, fullwidth-bar role tokens, answers ended by the eos
DEEPSEEK_V3 = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}{% endif %}{% endfor %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}<\uff5cUser\uff5c>{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}<\uff5cAssistant\uff5c>{{ m['content'] }}"
    "<\uff5cend\u2581of\u2581sentence\uff5c>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<\uff5cAssistant\uff5c>{% endif %}"
)
# Mistral v0.1: [INST] turns that must alternate, and any other role raises
MISTRAL_V01 = (
    "{{ bos_token }}{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]{% elif m['role'] == 'assistant' %}"
    "{{ m['content'] }}{{ eos_token }}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}"
)
# a ChatML template without a system role: a system message raises
CHATML_NO_SYSTEM = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass
class Family:
    template: str
    specials: list[str]
    eos: str
    bos: str | None = None
    pad: str | None = None
    added: list[str] = field(default_factory=list)  # added tokens that are not special (<think>)
    end_of_turn: str = ""  # the token auto must find
    refusal: tuple[str, str] | None = None  # (phrase of the default's fault, the key it names)
    fix: dict[str, Any] = field(default_factory=dict)  # model.* keys that make the layout work
    before: str = ""  # text the template supervises before the answer (with the fix)
    system_role: str = "native"
    all_assistant: bool = True  # False: history is rendered unlike a fresh answer; train_on all_assistant refused
    add_bos: bool = False  # the tokenizer adds the bos when asked for special tokens (add_bos_token), as Llama's does


IM = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
FAMILIES: dict[str, Family] = {
    "llama-3": Family(
        LLAMA_3,
        ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        eos="<|end_of_text|>",
        bos="<|begin_of_text|>",
        end_of_turn="<|eot_id|>",
    ),
    "llama-3.2": Family(
        LLAMA_32,
        ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        eos="<|end_of_text|>",
        bos="<|begin_of_text|>",
        end_of_turn="<|eot_id|>",
        refusal=("injects text that changes between two renders", "model.chat_template_kwargs: {date_string:"),
        fix={"chat_template_kwargs": {"date_string": "26 Jul 2024"}},
    ),
    "qwen2.5": Family(QWEN25, IM, eos="<|endoftext|>", end_of_turn="<|im_end|>"),
    "qwen3": Family(
        QWEN3,
        IM,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        added=["<think>", "</think>"],
        end_of_turn="<|im_end|>",
        before="<think>\n\n</think>\n\n",
    ),
    "qwen3-no-think": Family(
        QWEN3,
        IM,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        added=["<think>", "</think>"],
        end_of_turn="<|im_end|>",
        fix={"chat_template_kwargs": {"enable_thinking": False}},
        all_assistant=False,
    ),
    "deepseek-r1": Family(
        R1,
        [
            "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
            "<\uff5cend\u2581of\u2581sentence\uff5c>",
            "<\uff5cUser\uff5c>",
            "<\uff5cAssistant\uff5c>",
        ],
        eos="<\uff5cend\u2581of\u2581sentence\uff5c>",
        bos="<\uff5cbegin\u2581of\u2581sentence\uff5c>",
        added=["<think>", "</think>"],
        end_of_turn="<\uff5cend\u2581of\u2581sentence\uff5c>",
        refusal=("opens a think block", "model.chat_template"),
        fix={"chat_template": R1_NO_OPEN_THINK},
    ),
    "gemma-2": Family(
        GEMMA2,
        ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"],
        eos="<eos>",
        bos="<bos>",
        pad="<pad>",
        end_of_turn="<end_of_turn>",
        system_role="folded",
    ),
    "gemma-3": Family(
        GEMMA3,
        ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"],
        eos="<eos>",
        bos="<bos>",
        pad="<pad>",
        end_of_turn="<end_of_turn>",
    ),
    "mistral-v0.3": Family(
        MISTRAL,
        ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"],
        eos="</s>",
        bos="<s>",
        end_of_turn="</s>",
        system_role="folded",
    ),
    "phi-3": Family(
        PHI3,
        ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
        eos="<|endoftext|>",
        end_of_turn="<|end|>",
    ),
    "harmony": Family(
        HARMONY,
        ["<|endoftext|>", "<|start|>", "<|message|>", "<|channel|>", "<|end|>", "<|return|>", "<|call|>"],
        eos="<|return|>",
        pad="<|endoftext|>",
        end_of_turn="<|return|>",
        refusal=("injects text that changes between two renders", "model.chat_template_kwargs: {strftime_now:"),
        fix={"chat_template_kwargs": {"strftime_now": "2026-01-31"}},
        before="<|channel|>final<|message|>",
        all_assistant=False,
    ),
    "smollm3": Family(
        SMOLLM3,
        IM,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        added=["<think>", "</think>"],
        end_of_turn="<|im_end|>",
        refusal=("injects text that changes between two renders", "model.chat_template_kwargs: {strftime_now:"),
        fix={"chat_template_kwargs": {"strftime_now": "2026-01-31"}},
    ),
    "smollm3-no-think": Family(
        SMOLLM3,
        IM,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        added=["<think>", "</think>"],
        end_of_turn="<|im_end|>",
        refusal=("injects text that changes between two renders", "model.chat_template_kwargs: {strftime_now:"),
        fix={"chat_template_kwargs": {"strftime_now": "2026-01-31", "enable_thinking": False}},
    ),
    "phi-4": Family(
        PHI4,
        ["<|endoftext|>", "<|im_start|>", "<|im_sep|>", "<|im_end|>"],
        eos="<|im_end|>",
        pad="<|endoftext|>",
        end_of_turn="<|im_end|>",
    ),
    "granite-3": Family(
        GRANITE3,
        ["<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>"],
        eos="<|end_of_text|>",
        bos="<|end_of_text|>",
        end_of_turn="<|end_of_text|>",
    ),
    "command-r": Family(
        COMMAND_R,
        [
            "<PAD>",
            "<BOS_TOKEN>",
            "<|END_OF_TURN_TOKEN|>",
            "<|START_OF_TURN_TOKEN|>",
            "<|SYSTEM_TOKEN|>",
            "<|USER_TOKEN|>",
            "<|CHATBOT_TOKEN|>",
        ],
        eos="<|END_OF_TURN_TOKEN|>",
        bos="<BOS_TOKEN>",
        pad="<PAD>",
        end_of_turn="<|END_OF_TURN_TOKEN|>",
        add_bos=True,
    ),
    "olmo-2": Family(
        OLMO2,
        ["<|endoftext|>", "<|pad|>"],
        eos="<|endoftext|>",
        bos="<|endoftext|>",
        pad="<|pad|>",
        added=["<|system|>", "<|user|>", "<|assistant|>"],
        end_of_turn="<|endoftext|>",
    ),
    "llama-2": Family(
        LLAMA2,
        ["<unk>", "<s>", "</s>"],
        eos="</s>",
        bos="<s>",
        end_of_turn="</s>",
        add_bos=True,
    ),
    "deepseek-v3": Family(
        DEEPSEEK_V3,
        [
            "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
            "<\uff5cend\u2581of\u2581sentence\uff5c>",
            "<\uff5cUser\uff5c>",
            "<\uff5cAssistant\uff5c>",
        ],
        eos="<\uff5cend\u2581of\u2581sentence\uff5c>",
        bos="<\uff5cbegin\u2581of\u2581sentence\uff5c>",
        end_of_turn="<\uff5cend\u2581of\u2581sentence\uff5c>",
        add_bos=True,
    ),
    "mistral-v0.1": Family(
        MISTRAL_V01,
        ["<unk>", "<s>", "</s>"],
        eos="</s>",
        bos="<s>",
        end_of_turn="</s>",
        system_role="folded",
        add_bos=True,
    ),
    "chatml-no-system": Family(
        CHATML_NO_SYSTEM, IM, eos="<|im_end|>", pad="<|endoftext|>", end_of_turn="<|im_end|>", system_role="folded"
    ),
}


def family_tokenizer(fam: Family, vocab_size: int = 420):
    """A byte-level BPE tokenizer trained on a tiny corpus with the family's special tokens (and its
    non-special added tokens such as ``<think>``); ``chat_template`` is the family's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=fam.specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    if fam.add_bos:  # the bos added to every text tokenised with special tokens (Llama's add_bos_token)
        from tokenizers import processors

        tok.post_processor = processors.TemplateProcessing(
            single=f"{fam.bos} $A",
            pair=f"{fam.bos} $A {fam.bos} $B",
            special_tokens=[(fam.bos, tok.token_to_id(fam.bos))],
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=fam.bos, eos_token=fam.eos, pad_token=fam.pad or fam.eos
    )
    if fam.added:
        fast.add_tokens(fam.added)
    fast.chat_template = fam.template
    return fast
