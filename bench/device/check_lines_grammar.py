"""On the GPU machine, before a v13 run: its lines grammar compiles under the kit's xgrammar, accepts the few-shot
answers, and costs per token about what v10's JSON schema does (parse.lines_grammar says why it is EBNF)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import xgrammar as xgr
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from qwenspark.parse import json_schema, lines_grammar
from qwenspark.prompts import detect_lang, get_template


def mask_us_per_token(compiled: object, ids: list[int], vocab: int) -> float:
    """Mean time of one token's mask along ids (asserting each is accepted)."""
    matcher, mask, spent = xgr.GrammarMatcher(compiled), xgr.allocate_token_bitmask(1, vocab), 0.0
    for i in ids:
        t = time.perf_counter()
        matcher.fill_next_token_bitmask(mask)
        spent += time.perf_counter() - t
        assert matcher.accept_token(i), i
    return 1e6 * spent / len(ids)


def main() -> None:
    tok = AutoTokenizer.from_pretrained(sys.argv[1])
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
    compiler = xgr.GrammarCompiler(info)
    v10, v13 = get_template("v10"), get_template("v13")
    for (review, old), (_, new) in zip(v10.examples, v13.examples, strict=True):
        lang = detect_lang(review, None)
        schema = json.dumps(json_schema("verdict_first", 100, lang, True))
        as_json = json.dumps(json.loads(old), ensure_ascii=False, separators=(", ", ": "))
        costs = {"json": mask_us_per_token(compiler.compile_json_schema(schema, any_whitespace=False),
                                           [*tok.encode(as_json), tok.eos_token_id], len(tok)),
                 "lines": mask_us_per_token(compiler.compile_grammar(lines_grammar(100, lang)),
                                            [*tok.encode(new), tok.eos_token_id], len(tok))}
        print(json.dumps({"lang": lang, "mask_us_per_token": {k: round(v, 1) for k, v in costs.items()}}))


if __name__ == "__main__":
    main()
