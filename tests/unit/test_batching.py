"""Re-chunking gives fixed batch sizes whatever frames come in; token truncation flags what it cuts."""

import pandas as pd
import pytest

from qwenspark.batching import rechunk, truncate_by_tokens


@pytest.mark.parametrize("sizes", [[1, 1, 1, 1, 1, 1, 1], [10, 3], [0, 7, 0, 9], [32], [5] * 9, [100]])
@pytest.mark.parametrize("batch", [1, 4, 8])
def test_rechunk_fixed_sizes_order_and_no_loss(sizes: list[int], batch: int) -> None:
    frames, start = [], 0
    for size in sizes:
        frames.append(pd.DataFrame({"i": range(start, start + size)}, index=range(1000, 1000 + size)))
        start += size
    chunks = list(rechunk(iter(frames), batch))
    lengths = [len(c) for c in chunks]
    assert all(n == batch for n in lengths[:-1]) and (not lengths or 0 < lengths[-1] <= batch)
    assert pd.concat(chunks)["i"].tolist() == list(range(start)) if chunks else start == 0
    assert all(list(c.index) == list(range(len(c))) for c in chunks)


def test_rechunk_rejects_zero() -> None:
    with pytest.raises(ValueError, match="batch size"):
        list(rechunk(iter([]), 0))


def test_truncate_by_tokens() -> None:
    encode = lambda s: [ord(c) for c in s]  # noqa: E731
    decode = lambda ids: "".join(chr(i) for i in ids)  # noqa: E731
    assert truncate_by_tokens("abc", 5, encode, decode) == ("abc", False)
    assert truncate_by_tokens("abcdefgh", 5, encode, decode) == ("abcde", True)
    assert truncate_by_tokens("ab\ufffd", 3, encode, lambda ids: "ab\ufffd") == ("ab\ufffd", False)
    assert truncate_by_tokens("abcd", 3, encode, lambda ids: "ab\ufffd") == ("ab", True)


def test_a_text_of_fewer_bytes_than_the_cap_is_not_tokenised() -> None:
    seen: list[str] = []

    def encode(text: str) -> list[int]:
        seen.append(text)
        return list(text.encode())

    decode = lambda ids: bytes(ids).decode(errors="replace")  # noqa: E731
    assert truncate_by_tokens("好的", 7, encode, decode) == ("好的", False)  # 6 bytes
    assert seen == []
    assert truncate_by_tokens("好的", 6, encode, decode) == ("好的", False)  # 6 bytes: tokenised, fits
    assert truncate_by_tokens("好的!", 5, encode, decode) == ("好", True)  # the cut half character dropped
    assert seen == ["好的", "好的!"]
