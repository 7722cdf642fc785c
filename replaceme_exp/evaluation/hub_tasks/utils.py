"""Prompt functions of the hub tasks (``replaceme_*.yaml`` next to this file) that reproduce the
OpenCompass perplexity (PPL) prompts behind the Llama 2 comparison table of ReplaceMe (numbers
from LLM-Streamline / LaCo, evaluated with OpenCompass).

OpenCompass scores every candidate as one full prompt; for a base model without a meta template
the HUMAN and BOT turns of a template are joined with "\\n". Here the part shared by all
candidates is the lm-eval context and the part that differs is the choice, so that lm-eval's
loglikelihood of the choice ranks the candidates. Where only the final answer letter differs
(RACE) the ranking is the one of OpenCompass exactly; where the candidates differ in length
(C3, CMNLI, CHID) OpenCompass ranks by mean token loss over the whole prompt, which lm-eval
cannot reproduce exactly (``acc`` sums the choice's log-probability, ``acc_norm`` divides it by
its length in bytes).

Templates (open-compass/opencompass, configs/datasets/...):
  C3     CLUE_C3/CLUE_C3_ppl_e24a31.py   "文章：{content}\\n问题：{question}" + "\\n" + "答案：{choice}"
  CMNLI  CLUE_cmnli/CLUE_cmnli_ppl_fdc6de.py
         "语句一：“{sentence1}”\\n语句二：“{sentence2}”\\n请问这两句话是什么关系？" + "\\n" + 矛盾/蕴含/无关
  CHID   FewCLUE_chid/FewCLUE_chid_ppl_8f2872.py
         "以下句子是否通顺？\\n{content_i}" + "\\n" + "这个句子是通顺的。"
  RACE   race/race_ppl_5831a0.py
         "Article:\\n{article}\\nQuestion:\\n{question}\\nA. {A}\\nB. {B}\\nC. {C}\\nD. {D}" + "\\n" + "Answer: {X}"
(the versions listed in configs/datasets/collections/base_medium_llama.py).
"""

from __future__ import annotations

LETTERS = ["A", "B", "C", "D"]

# --------------------------------------------------------------------------------------- C3
# clue/clue, config c3: {"id": int, "context": [str, ...], "question": str, "choice": [str, ...],
# "answer": str}; validation = d-dev + m-dev (3816 questions); the test answers are hidden ("").


def c3_doc_to_text(doc: dict) -> str:
    # OpenCompass C3Dataset joins the passage's paragraphs / dialogue turns with a space.
    content = " ".join(doc["context"])
    return f"文章：{content}\n问题：{doc['question']}\n答案："


def c3_doc_to_choice(doc: dict) -> list[str]:
    # OpenCompass pads questions with fewer than 4 options with copies of the first option; a
    # copy can only tie with the first option and its argmin then keeps the first, so leaving the
    # padding out changes no prediction.
    return list(doc["choice"])


def c3_doc_to_target(doc: dict) -> int:
    return list(doc["choice"]).index(doc["answer"])


def c3_process_docs(dataset):
    return dataset.filter(lambda doc: doc["answer"] in doc["choice"])


# ------------------------------------------------------------------------------------ CMNLI
# clue/clue, config cmnli: {"sentence1": str, "sentence2": str, "label": ClassLabel, "idx": int},
# label names ["neutral", "entailment", "contradiction"]; rows labelled "-" were dropped by the
# original loading script; the test labels are hidden (-1).

CMNLI_CHOICES = ["无关", "蕴含", "矛盾"]  # indexed by the ClassLabel ids: neutral, entailment, contradiction


def cmnli_doc_to_text(doc: dict) -> str:
    return f"语句一：“{doc['sentence1']}”\n语句二：“{doc['sentence2']}”\n请问这两句话是什么关系？\n"


def cmnli_doc_to_choice(doc: dict) -> list[str]:
    return list(CMNLI_CHOICES)


def cmnli_doc_to_target(doc: dict) -> int:
    return int(doc["label"])


def cmnli_process_docs(dataset):
    return dataset.filter(lambda doc: doc["label"] in (0, 1, 2))


# ------------------------------------------------------------------------------------- CHID
# FewCLUE chid (datasets/chid/test_public.json, JSON lines):
# {"id": int, "candidates": [7 idioms], "content": str with one "#idiom#" blank, "answer": int}.

CHID_QUESTION = "以下句子是否通顺？\n"
CHID_CLAIM = "\n这个句子是通顺的。"


def chid_doc_to_text(doc: dict) -> str:
    return CHID_QUESTION


def chid_doc_to_choice(doc: dict) -> list[str]:
    # The candidates differ inside the sentence, so the whole filled-in sentence (and the claim
    # after it) is the scored continuation, as in OpenCompass's whole-prompt perplexity.
    return [doc["content"].replace("#idiom#", candidate) + CHID_CLAIM for candidate in doc["candidates"]]


def chid_doc_to_target(doc: dict) -> int:
    return int(doc["answer"])


def chid_process_docs(dataset):
    return dataset.filter(lambda doc: "#idiom#" in doc["content"] and 0 <= int(doc["answer"]) < len(doc["candidates"]))


# ------------------------------------------------------------------------------------- RACE
# ehovy/race, configs middle / high: {"example_id": str, "article": str, "answer": "A".."D",
# "question": str, "options": [4 str]}; one row per question.


def race_doc_to_text(doc: dict) -> str:
    options = "\n".join(f"{letter}. {option}" for letter, option in zip(LETTERS, doc["options"]))
    return f"Article:\n{doc['article']}\nQuestion:\n{doc['question']}\n{options}\nAnswer:"


def race_doc_to_choice(doc: dict) -> list[str]:
    return list(LETTERS)  # scored as " A" .. " D" (target_delimiter " "), as "Answer: A" in OpenCompass


def race_doc_to_target(doc: dict) -> int:
    return LETTERS.index(doc["answer"].strip())
