"""Answer formats: strict and lenient readings of real completions, correctness rules, normalisation,
and the row validation each format owns."""

from __future__ import annotations

import json
import time

import pytest

from conftest import ROWS, mc_example, qa_example, write_user_task
from softeval import SoftevalError, load_examples, load_task
from softeval.formats.math import Math
from softeval.formats.multiple_choice import MultipleChoice
from softeval.formats.number import Number, canonical_number
from softeval.formats.option_text import OptionText
from softeval.formats.short_answer import ShortAnswer, normalize
from softeval.tasks.prompts import target_text

SPORE = mc_example(["seed", "spore", "pollen", "immature flower"], 1)
FIGHT = mc_example(["call a teacher", "break up the fight", "walk away", "index fossils"], 0)


@pytest.mark.parametrize(
    "completion, strict, failure",
    [
        (" C", "C", None),  # smollm2, few-shot
        (" B. spore", "B", None),
        ("(B) spore", "B", None),
        ("B)", "B", None),
        ("", None, "empty completion"),  # smollm2 zero-shot: ends its turn at once
        (" The answer is B.", None, "does not start with an option letter"),
        (" E", None, "'E' is not one of the options ABCD"),
        (" Because spores spread", None, "does not start with an option letter"),
    ],
)
def test_multiple_choice_strict(completion, strict, failure):
    parsed = MultipleChoice().strict(completion, SPORE)
    assert parsed.answer == strict
    assert (parsed.note or "").startswith(failure or "")


@pytest.mark.parametrize(
    "completion, strict, lenient",
    [
        # "A" before a lower-case word is the article for both parsers; "A is ..." a letter for both
        (" A plant needs water", None, None),
        (" A is the answer because the seed grows", "A", "A"),
        (" A spore is the answer", None, "B"),  # the article, then option B's text
        (" B", "B", "B"),
    ],
)
def test_one_letter_rule_for_both_parsers(completion, strict, lenient):
    fmt = MultipleChoice()
    assert fmt.strict(completion, SPORE).answer == strict
    assert fmt.lenient(completion, SPORE).answer == lenient


def test_article_is_not_an_answer_to_either_parser():
    fmt = MultipleChoice()
    strict, lenient = fmt.strict(" A plant needs water", SPORE), fmt.lenient(" A plant needs water", SPORE)
    assert strict.answer is None and "word 'A'" in strict.note
    assert lenient.answer is None and lenient.status == "no_answer"


@pytest.mark.parametrize(
    "completion, example, letter, text_of",
    [
        (" A. break up the fight", FIGHT, "A", "B"),
        (" C. index fossils", FIGHT, "C", "D"),
        (" A. break up the", FIGHT, "A", "B"),  # cut by the token limit
    ],
)
def test_letter_that_contradicts_its_text_is_a_conflict(completion, example, letter, text_of):
    fmt = MultipleChoice()
    for reading in (fmt.strict(completion, example), fmt.lenient(completion, example)):
        assert reading.answer is None and reading.status == "conflict"
        assert reading.note == f"letter {letter} but the text of option {text_of}"


def test_letter_with_its_own_text_is_one_answer():
    fmt = MultipleChoice()
    assert fmt.strict(" B. break up the fight", FIGHT).answer == "B"
    assert fmt.lenient(" D. the index fossils", FIGHT).answer == "D"


RIBS = mc_example(["The ribs", "The ribs and sternum", "The ribs, sternum and clavicle", "The ribs, sternum, clavicle and vertebrae"], 2)
SIGNS = mc_example(["1", "-1", "i", "-i"], 1)


@pytest.mark.parametrize(
    "completion, example, cut, reading",
    [
        # the letter's own text, stopped short: not the shorter option's text it starts with
        (" C. The ribs, sternum and", RIBS, True, "C"),
        (" C. The ribs, sternum and", RIBS, False, "C"),  # goes on past A's text: only C's begins so
        (" C. The ribs", RIBS, True, "C"),  # cut by the token limit inside C's text
        (" C. The ribs", RIBS, False, "conflict"),  # finished with A's text
        (" C. The ribs are below the", RIBS, True, "conflict"),  # A's text, then words of no option
        # an option's own sign is part of its text, not a dash after the letter
        (" B. -1", SIGNS, False, "B"),
        (" A. -1", SIGNS, False, "conflict"),
        (" B - -1", SIGNS, False, "B"),
        (" A - 1", SIGNS, False, "A"),
    ],
)
def test_an_echo_of_an_option_is_read_as_written(completion, example, cut, reading):
    fmt = MultipleChoice()
    for parsed in (fmt.strict(completion, example, cut=cut), fmt.lenient(completion, example, cut=cut)):
        assert (parsed.answer or parsed.status) == reading


@pytest.mark.parametrize("completion", [" A B C D", " A or B", " I think it is pollen, not a seed", " B, C"])
def test_naming_several_options_is_ambiguous(completion):
    fmt = MultipleChoice()
    lenient = fmt.lenient(completion, SPORE)
    assert lenient.answer is None and lenient.status == "ambiguous"
    assert fmt.strict(completion, SPORE).answer is None


def test_lenient_finds_one_option_anywhere():
    fmt = MultipleChoice()
    assert fmt.lenient(" The answer is B.", SPORE).answer == "B"
    assert fmt.lenient(" I think it is pollen", SPORE).answer == "C"
    # a shorter option's text inside a longer option's text counts for the longer one
    example = mc_example(["heat", "heat and light", "sound"], 1)
    assert fmt.lenient(" It gives off heat and light", example).answer == "B"


GSM = qa_example("72")
GSM18 = qa_example("18")


@pytest.mark.parametrize(
    "completion, strict, lenient",
    [
        (" Natalia sold 48/2 = 24 clips in May.\nShe sold 48+24 = 72 clips altogether.\n#### 72", "72", "72"),
        (" She sold 48 + 24 = 72 clips in total.", None, "72"),
        (" #### 1,250", "1250", "1250"),
        (" The answer is $72.00.", None, "72"),
        (" I don't know", None, None),
    ],
)
def test_number(completion, strict, lenient):
    fmt = Number()
    assert fmt.strict(completion, GSM).answer == strict
    assert fmt.lenient(completion, GSM).answer == lenient
    assert fmt.is_correct(fmt.strict(completion, GSM).answer, GSM) == (strict == "72")


QA = qa_example("Annie Lennox", "Lennox")


@pytest.mark.parametrize(
    "completion, strict_ok, strict_correct, lenient_correct",
    [
        (" Annie Lennox", True, True, True),
        (" the Annie Lennox.", True, True, True),  # normalisation drops articles and punctuation
        (" Dave Stewart", True, False, False),
        # smollm2 zero-shot: rambles past the short-answer limit
        (' The female member of the 1980\'s pop music duo, "Eurythmics" was the', False, False, False),
        (" It was singer Annie Lennox of the Eurythmics, born in Aberdeen in 1954", False, False, True),
        ("\nAnnie Lennox", True, True, True),  # judged after the leading newline
    ],
)
def test_short_answer(completion, strict_ok, strict_correct, lenient_correct):
    fmt = ShortAnswer(max_answer_words=10)
    strict = fmt.strict(completion, QA)
    assert (strict.answer is not None) == strict_ok
    assert fmt.is_correct(strict.answer, QA) == strict_correct
    assert fmt.is_correct(fmt.lenient(completion, QA).answer, QA) == lenient_correct


BIAFRA = qa_example("Biafra", "Republic of Biafra", "Nigeria-Biafra war")


def test_listing_candidates_is_ambiguous():
    fmt = ShortAnswer(normalization="triviaqa")
    for completion in (" Lagos, Ghana, Biafra, Congo", " Biafra or Ghana"):
        for reading in (fmt.strict(completion, BIAFRA), fmt.lenient(completion, BIAFRA)):
            assert reading.answer is None and reading.status == "ambiguous"
    # two comma-separated parts are one answer, and an alias written whole is never a list
    assert fmt.is_correct(fmt.lenient(" Biafra, Nigeria", BIAFRA).answer, BIAFRA)


def test_numeric_alias_needs_to_be_the_only_number():
    fmt = ShortAnswer()
    one = qa_example("1")
    assert not fmt.is_correct(fmt.lenient(" 2^0 = 1", one).answer, one)
    assert fmt.is_correct(fmt.lenient(" It was 1 apple", one).answer, one)
    # the number format's own rule takes the last number
    assert Number().lenient(" 2^0 = 1", one).answer == "1"
    # an alias written with several numerals is found where those are the line's numbers
    war = qa_example("1914-1918")
    assert fmt.is_correct(fmt.lenient(" The war lasted 1914-1918.", war).answer, war)
    assert not fmt.is_correct(fmt.lenient(" From 1914-1918 and then 1939", war).answer, war)


def test_an_alias_the_question_holds_is_not_read_inside_the_line(mirror):
    spec = load_task("triviaqa")
    rows = {e.question: e for e in load_examples(spec, "validation", mirror)}
    maryland, born_first = rows["What is the state capital of Maryland"], rows["Who was born first, Kiefer Sutherland or Christian Slater?"]
    fmt = spec.format
    assert "Capital of Maryland" in maryland.aliases  # a Wikipedia redirect among Annapolis's aliases
    # restating the question is no evidence of the answer, wherever the model goes after it
    wrong = fmt.lenient(" The capital of Maryland is Baltimore", maryland)
    assert not fmt.is_correct(wrong.answer, maryland)
    assert wrong.note == "the gold answer 'Capital of Maryland' is in the question too: not read inside the line"
    assert not fmt.is_correct(fmt.lenient(" Christian Slater was born first, Kiefer Sutherland.", born_first).answer, born_first)
    # the gold answer opening the line commits to it, as in a choice question's answer
    assert fmt.is_correct(fmt.lenient(" Kiefer Sutherland was born first.", born_first).answer, born_first)
    assert not fmt.is_correct(fmt.lenient(" Capital of Maryland is Baltimore", maryland).answer, maryland)  # not the gold answer itself
    # an alias the question does not hold is still found, and the line equal to an alias counts
    assert fmt.is_correct(fmt.lenient(" The capital of Maryland is Annapolis", maryland).answer, maryland)
    assert fmt.is_correct(fmt.lenient(" Kiefer Sutherland", born_first).answer, born_first)


def test_an_alias_the_normalisation_empties_is_compared_as_written(mirror):
    # NQ-open's gold for the most common blood type in Sweden: SQuAD's rule drops "A" as an
    # article and "+" as punctuation, which would leave nothing to compare
    spec = load_task("nq_open")
    sweden = next(e for e in load_examples(spec, "validation", mirror) if "blood type in sweden" in e.question.lower())
    assert normalize("A+", "squad") == "" and "A+" in sweden.aliases
    fmt = ShortAnswer(normalization="squad")
    for completion in (" A+", " a+.", " AB+", " **A+**", " (A+)"):
        assert fmt.is_correct(fmt.strict(completion, sweden).answer, sweden), completion
    # an answer of articles and punctuation only is not that alias
    for completion in (" The", " A", " +", " B+", " A++"):
        assert not fmt.is_correct(fmt.strict(completion, sweden).answer, sweden), completion
    # lenient finds it inside the line as written, not as part of a longer sign
    assert fmt.is_correct(fmt.lenient(" The answer is A+.", sweden).answer, sweden)
    assert not fmt.is_correct(fmt.lenient(" The answer is O, then A++ grades", sweden).answer, sweden)
    band = qa_example("The The")  # emptied too, and made of words: spaces around it are no part of it
    assert fmt.is_correct(fmt.lenient(" I like the the band", band).answer, band)
    assert not fmt.is_correct(fmt.lenient(" I like theThe", band).answer, band)
    vitamin = qa_example("A")  # an article alone is equal to the answer or not at all
    assert fmt.is_correct(fmt.lenient(" A", vitamin).answer, vitamin)
    assert not fmt.is_correct(fmt.lenient(" It is a vitamin", vitamin).answer, vitamin)
    star = qa_example("the symbol ×", "*")
    assert fmt.is_correct(fmt.lenient(" *", star).answer, star)
    assert not fmt.is_correct(fmt.lenient(" A", star).answer, star)


def test_triviaqa_normalisation_is_the_official_rule():
    fmt = ShortAnswer(normalization="triviaqa")
    assert normalize("Nigeria-Biafra war", "triviaqa") == normalize("Nigeria Biafra war", "triviaqa") == "nigeria biafra war"
    assert normalize("‘Crimson Tide’", "triviaqa") == "crimson tide"
    assert fmt.is_correct("Nigeria Biafra war", BIAFRA)
    # SQuAD's rule deletes punctuation instead, joining the words
    assert normalize("Nigeria-Biafra war", "squad") == "nigeriabiafra war"
    assert not ShortAnswer(normalization="squad").is_correct("Nigeria Biafra war", BIAFRA)


def test_triviaqa_targets_use_a_readable_alias(mirror):
    spec = load_task("triviaqa")
    examples = load_examples(spec, "train", mirror)
    caps = [e for e in examples if e.row["answer"]["value"].isupper()]
    assert len(caps) > 100  # a quarter of the split has ALL-CAPS gold values
    shouting = lambda text: any(len(w) >= 5 and w.isalpha() and w.isupper() for w in text.split())  # noqa: E731
    assert not any(shouting(e.answer) for e in caps)
    chandler = next(e for e in caps if e.row["answer"]["value"] == "CHAS CHANDLER")
    assert chandler.answer == "Chas Chandler"


def test_empty_option_text_is_a_load_error(tmp_path):
    spec = load_task(write_user_task(tmp_path, [ROWS[0], {**ROWS[1], "b": "  "}]))
    with pytest.raises(SoftevalError, match=r"test\.jsonl:2: option B has empty text"):
        load_examples(spec, "test")


def test_non_numeric_gold_is_a_load_error(tmp_path):
    rows = [{"q": "How many?", "gold": "12"}, {"q": "How many?", "gold": "twelve"}]
    spec = load_task(
        write_user_task(tmp_path, rows, answer_format="number", fields={"question": "q", "answer": "gold", "solution": "'#### ' ~ gold"},
                        target=" {{ solution }}", cloze_template=None)
    )
    with pytest.raises(SoftevalError, match=r"test\.jsonl:2: gold answer 'twelve' is not a number"):
        load_examples(spec, "test")


@pytest.mark.parametrize(
    "row, raw_completion, strict, status",
    [
        # gemma-3-270m zero-shot on ARC-Easy: a newline, then a letter with another option's text
        (1066, "\nA. a medium.", None, "conflict"),  # "a medium." is option B
        (1466, "\nA. mean.", "A", "answer"),  # "mean." is option A itself
    ],
)
def test_real_gemma_completions_on_arc_easy(mirror, row, raw_completion, strict, status):
    spec = load_task("arc_easy")
    example = next(e for e in load_examples(spec, "test", mirror) if e.index == row)
    reading = spec.format.strict(raw_completion, example)
    assert (reading.answer, reading.status) == (strict, status)
    assert spec.format.lenient(raw_completion, example).status == status


HEAT = mc_example(["heat", "heat and light", "sound", "cold"], 1)


@pytest.mark.parametrize(
    "completion, reading, status",
    [
        (" A. heat and light", None, "conflict"),  # the longer option's text is B's, not A's
        (" B. heat and light", "B", "answer"),
        (" B. heat and light, not sound", "B", "answer"),  # after a letter, option texts explain
        (" B. Washington, D.C.", "B", "answer"),  # letters in an abbreviation are no options
        (" B\nC", "B", "answer"),  # the first line is the answer
        (" A\u00a0plant", None, "no_answer"),  # a non-breaking space still makes "A" the article
    ],
)
def test_multiple_choice_edge_cases(completion, reading, status):
    fmt = MultipleChoice()
    for parsed in (fmt.strict(completion, HEAT), fmt.lenient(completion, HEAT)):
        assert (parsed.answer, parsed.status) == (reading, status)


@pytest.mark.parametrize(
    "completion, strict, lenient",
    [
        (" #### 72 or 74", "72", "72"),  # the marked answer is the lenient one too
        (" #### 1/2", None, None),  # a fraction is not the number 1 or 2
        (" 3,4", None, None),  # not a thousands separator
        (" $1,234.50 in total", None, "1234.5"),
        (" #### -8", "-8", "-8"),
        # a sign is never dropped: -3 is not the gold 3 (GSM below is 72, so compare readings)
        (" #### \u22123", "-3", "-3"),  # the Unicode minus
        (" #### - 3", "-3", "-3"),  # a sign apart from its number, after the marker
        (" #### $-3", "-3", "-3"),
        (" #### -$3", "-3", "-3"),
        (" #### - $3", "-3", "-3"),
        (" ####\n- 3 eggs\n#### 7", "7", "7"),  # a bullet on the next line is no sign
        (" 10 - 3", None, "3"),  # elsewhere, a subtraction
        (" so it is \u22125 degrees", None, "-5"),
    ],
)
def test_number_edge_cases(completion, strict, lenient):
    fmt = Number()
    assert fmt.strict(completion, GSM).answer == strict
    assert fmt.lenient(completion, GSM).answer == lenient


def test_a_cut_number_completion_gives_no_guess_from_where_it_stopped():
    fmt = Number()
    looping = " Step 1: 48 + 24 = 72\nStep 2: 72 * 2 = 144\nStep 3: Determine the total = 144 + 2 = "
    assert fmt.lenient(looping, GSM).answer == "2"  # had it ended there: its last number
    cut = fmt.lenient(looping, GSM, cut=True)
    assert cut.answer is None and "token limit" in cut.note
    # a stated or marked answer before the cut still counts: the last one it stated
    assert fmt.lenient(" The answer is 70.\nThe answer is 72.\nThe ans", GSM, cut=True).answer == "72"
    assert fmt.lenient(" So the final answer is: $-72, as", GSM, cut=True).answer == "-72"
    assert fmt.lenient(" Answer: 72 clips, since 48 + 24 = 72 and then", GSM, cut=True).answer == "72"
    # a sum is not its first term; finished, the completion's last number is its result
    assert fmt.lenient(" The answer is 6 + 3 = 9.\nThen 9 * 2 is", GSM, cut=True).answer is None
    assert fmt.lenient(" The answer is 6 + 3 = 9.", GSM).answer == "9"
    assert fmt.lenient(" To answer this, 48 + 24 = 72, so", GSM, cut=True).answer is None
    assert fmt.strict(" So #### 72\nQuestion 2 and more", GSM, cut=True).answer == "72"
    # the last word may be unfinished: "#### 7" could have gone on to "#### 72"
    assert fmt.strict(" 48 + 24 = 72\n#### 7", GSM, cut=True).answer is None
    assert fmt.strict(" 48 + 24 = 72\n#### 7", GSM).answer == "7"


@pytest.mark.parametrize(
    "completion, stated",
    [
        (" The answer is 72, since", "72"),
        (" The answer is **72**. Then", "72"),
        (" The final answer is \\boxed{72} and then", "72"),
        (" So\nAnswer\uff1a72 and", "72"),  # a full-width colon
        # a calculation is not its first term, whatever the operator
        (" The answer is 1.5 * 48 = 72 and", None),  # nor "1" of "1.5"
        (" The answer is 70.5 + 1.5 = 72 and", None),
        (" The answer is 74 \u2212 2 = 72 and", None),  # Unicode minus
        (" The answer is 74 \u2013 2 = 72 and", None),  # en dash
        (" The answer is 8 x 9 = 72 so", None),
        (" The answer is 8 times 9", None),
        (" The answer is $8 \\times 9 = 72$ and so", None),
        (" The answer is 36 plus 36, which is 72. And", None),
        # "answer:" inside a sentence states nothing; opening a line it does
        (" We need to find the answer: 48 clips in April and", None),
        (" The answer is 8 xylophones and", "8"),
    ],
)
def test_a_cut_completion_counts_only_a_number_stated_as_its_answer(completion, stated):
    assert Number().lenient(completion, GSM, cut=True).answer == stated


def test_a_decimal_is_never_read_as_its_whole_part():
    fmt = Number()
    assert fmt.lenient(" so 12.5/2 apples", GSM).answer is None  # a fraction, not 12
    assert fmt.lenient(" it costs 12.50.", GSM).answer == "12.5"


def test_math_cut_reads_no_unfinished_final_answer():
    fmt = Math()
    SEVEN = qa_example("7")
    assert fmt.lenient(" Final Answer: 12", SEVEN, cut=True).answer is None  # "12" of "125"?
    assert fmt.lenient(" Final Answer: 12", SEVEN).answer == "12"
    assert fmt.strict(" so \\boxed{7}", SEVEN, cut=True).answer == "7"  # a closed brace is finished
    assert fmt.strict(" so \\boxed{7} and then", SEVEN, cut=True).answer == "7"
    assert fmt.strict(" so \\boxed 7", SEVEN, cut=True).answer is None  # 7 or 71?
    # the limit fell inside the last \boxed: the one before it, on a finished line, is the answer
    # where the unfinished one repeats it so far; another answer begun there leaves none
    for repeated in (" \\boxed{7}\nso \\boxed{7", " \\boxed{7}\nso \\boxed{", " \\boxed{7}\nso \\boxed 7"):
        assert fmt.strict(repeated, SEVEN, cut=True).answer == "7"
    for revised in (" \\boxed{2}.\nThen the answer is \\boxed{\\frac{3", " \\boxed{7}\nthen \\boxed 1"):
        for parser in (fmt.strict, fmt.lenient):
            reading = parser(revised, SEVEN, cut=True)
            assert reading.answer is None and reading.note == "cut at the token limit inside its last \\boxed answer"
    assert fmt.lenient(" Final Answer: 7\nso \\boxed{7", SEVEN, cut=True).answer == "7"
    assert fmt.lenient(" Final Answer: 2\nso \\boxed{7", SEVEN, cut=True).answer is None
    # an unclosed "$" may go on: "\frac{1}{2}" of "\frac{1}{2}\pi"
    assert fmt.lenient(" The final answer is $\\frac{1}{2}", SEVEN, cut=True).answer is None
    assert fmt.lenient(" Final Answer: $7$\nand more", SEVEN, cut=True).answer == "7"


def test_numbers_compare_exactly_at_any_length():
    assert canonical_number("1." + "0" * 40 + "1") != canonical_number("1")  # a float would equal them
    assert canonical_number("0" * 150) == "0"
    assert canonical_number("1" + "0" * 150) == "1" + "0" * 150  # a float reads 9999...
    assert canonical_number("1.50") == canonical_number("1.5") == "1.5"
    assert canonical_number("1e999999999") == "1E+999999999"  # kept short, not written out
    assert canonical_number("nan") is None and canonical_number("inf") is None


def test_readable_alias_keeps_capitals_without_an_ordinary_alias():
    fmt = ShortAnswer(normalization="triviaqa")
    assert fmt.readable("NATO", ["NATO", "N.A.T.O."]) == "NATO"
    assert fmt.readable("BLUE", ["BLUE", "Blue (colour)", "Blue"]) == "Blue"
    assert fmt.readable("STEPTOE", ["STEPTOE"]) == "Steptoe"


# --- option text ---------------------------------------------------------------------------------------

HEAT = mc_example(["heat", "heat and light", "water", "the wind"], 1)


@pytest.mark.parametrize(
    "completion, strict, lenient, status",
    [
        (" heat and light", "B", "B", "answer"),
        (" Heat and light.\nBecause ...", "B", "B", "answer"),  # case, punctuation, later lines
        (" wind", "D", "D", "answer"),  # articles do not count
        (" B", None, None, "no_answer"),  # a letter is not the option's text
        (" It is heat and light, I think", None, "B", "answer"),  # "heat" inside the longer option
        (" water or wind", None, None, "ambiguous"),
        (" water, wind", None, None, "ambiguous"),
        (" Water, because the wind is calm", None, "C", "answer"),  # an opening text commits
        (" The wind.", "D", "D", "answer"),
        (" steam", None, None, "no_answer"),
        ("", None, None, "no_answer"),
        # an option label is not the option's text (normalisation would drop "A)" as the article
        # "a"); lenient reads the text after it (the options are not lettered in the prompt)
        (" A) heat and light", None, "B", "answer"),
        (" a) heat and light", None, "B", "answer"),
        (" A. water", None, "C", "answer"),
        (" (D) the wind", None, "D", "answer"),
        (" A heat", "A", "A", "answer"),  # "A" before a word is the article
    ],
)
def test_option_text(completion, strict, lenient, status):
    fmt = OptionText()
    assert fmt.strict(completion, HEAT).answer == strict
    reading = fmt.lenient(completion, HEAT)
    assert (reading.answer, reading.status) == (lenient, status)


def test_option_text_keeps_options_apart_that_normalisation_would_merge():
    fmt = OptionText()
    signs = mc_example(["+2", "-2", "0"], 1)
    assert fmt.strict(" -2", signs).answer == "B" and fmt.strict(" +2.", signs).answer == "A"
    assert fmt.is_correct(fmt.strict(" -2", signs).answer, signs) and not fmt.is_correct("A", signs)
    genes = mc_example(["WW or ww", "WW or Ww", "ww or ww"], 0)
    assert [fmt.strict(" " + c, genes).answer for c in genes.choices] == ["A", "B", "C"]
    assert fmt.chance(genes) == 1 / 3


def test_an_option_text_that_opens_like_a_label_is_still_that_option():
    fmt = OptionText()
    names = mc_example(["A. Lincoln", "G. Washington", "Washington"], 0)
    assert fmt.strict(" A. Lincoln", names).answer == "A" and fmt.lenient(" G. Washington", names).answer == "B"
    assert fmt.strict(" A. Washington", names).answer is None  # another option's text after a label


def test_option_text_reads_every_arc_target_as_correct(mirror):
    for name in ("arc_easy_text", "arc_challenge_text"):
        spec = load_task(name)
        for example in load_examples(spec, "test", mirror):
            target = target_text(spec, example)
            assert spec.format.is_correct(spec.format.strict(target, example).answer, example), (example.source, target)
            assert spec.format.is_correct(spec.format.lenient(target, example).answer, example), (example.source, target)


def test_text_tasks_leave_room_for_the_longest_option(mirror, tokenizer_dirs):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dirs["llama"])
    for name in ("arc_easy_text", "arc_challenge_text"):
        spec = load_task(name)
        longest = max(len(tokenizer.encode(" " + c)) for e in load_examples(spec, "test", mirror) for c in e.choices)
        assert longest + 1 <= spec.max_new_tokens  # the option and its stop string


# --- math ------------------------------------------------------------------------------------------------

QUADRATIC = (
    "We factor $x^2 - 5x + 6 = (x-2)(x-3)$, so the roots are $2$ and $3$. Their ratio is"
    " $\\frac{2}{3}$, hence the answer is $\\boxed{\\dfrac{2}{3}}$."
)


def math_example(answer: str):
    return Math().example({"question": "q", "answer": answer, "solution": "s"}, index=0, source="t", row={})


@pytest.mark.parametrize(
    "completion, gold, strict, lenient, correct",
    [
        (QUADRATIC, "\\frac23", "\\dfrac{2}{3}", "\\dfrac{2}{3}", True),
        ("The midpoint is $\\boxed{0.5}$.", "\\frac{1}{2}", "0.5", "0.5", True),
        ("So $x = \\boxed{-8}$.", "8", "-8", "-8", False),  # the sign counts
        ("The value is $\\boxed{3.5}$", "35", "3.5", "3.5", False),  # no digit-gluing normalisation
        ("Hence $\\boxed{\\frac{1}{2}}$", "12", "\\frac{1}{2}", "\\frac{1}{2}", False),
        ("The set is $\\boxed{[0, 1)}$.", "[0,1)", "[0, 1)", "[0, 1)", True),
        ("The set is $\\boxed{(0, 1)}$.", "[0,1)", "(0, 1)", "(0, 1)", False),  # an interval, not a string
        ("The point is $\\boxed{(1,2)}$.", "(1, 2)", "(1,2)", "(1,2)", True),
        ("Nested: $\\boxed{\\frac{\\sqrt{3}}{2}}$ at last", "\\frac{\\sqrt3}{2}", "\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt{3}}{2}", True),
        ("Adding gives \\boxed 9.", "9", "9", "9", True),
        ("First $\\boxed{4}$, but correcting the sign: $\\boxed{-4}$", "-4", "-4", "-4", True),  # the last box
        ("Adding them up, the final answer is $14$.", "14", None, "14", True),
        ("Answer: 2/3", "\\frac{2}{3}", None, "2/3", True),
        ("We get $\\boxed{\\frac{1}{", "\\frac{1}{2}", None, None, False),  # cut off inside the box
        ("As in the original solutions, $\\fbox{7}$.", "7", "7", "7", True),
        ("Spaced: $\\boxed {5}$", "5", "5", "5", True),
        ("Bare: $\\boxed 3 + 4$, which is 7", "7", "3 + 4", "3 + 4", True),
        ("Final Answer: The final answer is $\\frac{3}{4}$. I hope it is correct.", "0.75", None, "\\frac{3}{4}", True),
        ("The final answer is: 7", "7", None, "7", True),
        # prose after "answer:" is not an answer, even where it ends in the right number
        ("We want to find the answer: first we compute 3+4=7.", "7", None, None, False),
    ],
)
def test_math(completion, gold, strict, lenient, correct):
    fmt, example = Math(), math_example(gold)
    assert fmt.strict(completion, example).answer == strict
    reading = fmt.lenient(completion, example).answer
    assert reading == lenient
    assert fmt.is_correct(reading, example) is correct


def test_math_task_takes_the_answer_from_the_solution(tmp_path):
    solution = "Since $3x + 2 = 11$, we have $3x = 9$ and $x = \\boxed{3}$."
    folder = tmp_path / "EleutherAI" / "hendrycks_math" / "algebra"
    folder.mkdir(parents=True)
    row = {"problem": "Solve $3x + 2 = 11$.", "level": "Level 1", "type": "Algebra", "solution": solution}
    (folder / "test.jsonl").write_text(json.dumps(row) + "\n")
    spec = load_task("hendrycks_math")
    (example,) = load_examples(spec, "test", tmp_path)
    assert (example.question, example.answer, example.solution) == (row["problem"], "3", solution)
    assert spec.format.is_correct(spec.format.strict(" " + solution, example).answer, example)
    (folder / "test.jsonl").write_text(json.dumps({**row, "solution": "x is 3"}) + "\n")
    with pytest.raises(SoftevalError, match=r"test\.jsonl:1: no gold answer \(None\); .*a solution without \\boxed\{\}\?"):
        load_examples(spec, "test", tmp_path)
    (folder / "test.jsonl").write_text(json.dumps({**row, "solution": "so $x = \\boxed{$}$"}) + "\n")
    with pytest.raises(SoftevalError, match=r"test\.jsonl:1: gold answer '\$' is not mathematics math-verify can read"):
        load_examples(spec, "test", tmp_path)


def test_math_equivalence_works_off_the_main_thread():
    import threading

    results = []
    thread = threading.Thread(target=lambda: results.append(Math().is_correct("0.5", math_example("\\frac{1}{2}"))))
    thread.start()
    thread.join()
    assert results == [True]


def test_digits_grouped_by_spaces_are_one_number_only_when_the_spaces_say_so():
    fmt = Number()
    thousand = qa_example("1000")
    # a no-break or thin space groups digits: one number, strict and lenient alike
    for space in ("\u00a0", "\u2009", "\u202f"):
        assert fmt.strict(f" #### 1{space}000", thousand).answer == "1000"
        assert fmt.lenient(f" so the total is 1{space}000 apples.", thousand).answer == "1000"
    assert fmt.strict(" #### 1\u202f234\u202f567.5", thousand).answer == "1234567.5"
    # a plain space may separate two numbers: neither 1, nor the 0 of "000", nor 1000 silently
    for completion in (" #### 1 000", " so the total is 1 000 apples.", " #### 1 000\nThe answer is 5"):
        strict, lenient = fmt.strict(completion, thousand), fmt.lenient(completion, thousand)
        assert lenient.answer is None and lenient.status == "ambiguous" and "'1 000'" in lenient.note
        assert strict.answer is None
    assert fmt.lenient(" The answer is 1 000, so", thousand, cut=True).status == "ambiguous"
    # numbers apart that are no thousands groups read as before
    assert fmt.lenient(" 2 4 6 8", thousand).answer == "8"
    assert fmt.lenient(" in 2019 150 people came", thousand).answer == "150"
    assert fmt.lenient(" 1 0000", thousand).answer == "0"


def test_a_cut_number_may_have_stopped_inside_its_digit_groups():
    fmt = Number()
    # "#### 1 000" may have gone on as "#### 1 000 000": the digit groups before the cut go too
    assert fmt.strict(" #### 1\u202f000", qa_example("1000"), cut=True).answer is None
    assert fmt.strict(" #### 1\u202f000 apples", qa_example("1000"), cut=True).answer == "1000"
    assert fmt.strict(" #### 72 and", GSM, cut=True).answer == "72"


@pytest.mark.parametrize(
    "completion, read",
    [
        (" #### 2019 20", "2019"),  # "20" may go on; 2019 is no group of it
        (" #### 1234 5", "1234"),
        (" #### 1,250 7", "1250"),
        (" #### 45.75 3", "45.75"),
        (" #### 18 20 3", "18"),  # "20 3" may go on as "20 300"
        (" #### 5 000 000 1", None),  # "5 000 000 1..." could be one number
    ],
)
def test_a_cut_number_loses_only_the_groups_its_last_word_may_continue(completion, read):
    assert Number().strict(completion, GSM, cut=True).answer == read


def test_reading_a_cut_number_takes_linear_time():
    # a repetition loop of digits cut at the token limit: a backtracking search from every
    # position would take minutes on this; reading it backwards takes a fraction of a second
    fmt = Number()
    for looping in ("1 " * 50_000 + "1", "123 " * 25_000 + "12", "7" * 100_000):
        start = time.perf_counter()
        fmt.lenient(looping, GSM, cut=True)
        assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize(
    "completion, status, written",
    [
        (" #### 2 500,00", "ambiguous", "2 500,00"),  # not the 2 before its groups
        (" #### 1\u00a0000,50", "ambiguous", "1\u00a0000,50"),  # not 1
        (" #### 1\t000", "ambiguous", "1\t000"),  # a tab is no surer a grouping than a space
        (" So 3 + 2 = 5,5\n#### 5,5", "ambiguous", "5,5"),  # 5.5, or 55? not the 2 of the sum
        (" 12 + 988 = 1.000,50 in all", "ambiguous", "1.000,50"),  # not 12, or 988
        (" x is 7 and y is 2,5", "ambiguous", "2,5"),  # not 7
        (" 1/6 + 6 = 1/3", "no_answer", "1/3"),  # the result is a fraction: not 6
        (" #### 1/2\nso it is 7", "no_answer", "1/2"),  # the marked answer is a fraction: not 7
        (" it costs 3 + .5", "no_answer", ".5"),  # not 3
    ],
)
def test_a_number_the_format_cannot_read_is_not_replaced_by_another(completion, status, written):
    fmt = Number()
    reading = fmt.lenient(completion, GSM)
    assert (reading.answer, reading.status) == (None, status)
    assert repr(written) in reading.note  # the note quotes the number as written
    assert fmt.strict(completion, GSM).answer is None


def test_numbers_next_to_a_unit_or_another_number_still_read():
    fmt = Number()
    assert fmt.lenient(" so she earns $50,000/year", qa_example("50000")).answer == "50000"  # "/year" is no fraction
    assert fmt.strict(" #### 72/month", GSM).answer == "72"
    assert fmt.lenient(" 10-3", GSM).answer == "3"  # a subtraction ends in 3, not -3
    assert fmt.lenient(" so it is -3", GSM).answer == "-3"
    assert fmt.lenient(" in 2019 150 people came", GSM).answer == "150"
    # cut: a stated number is not the first group of a calculation's first term
    assert fmt.lenient(" The answer is 1 000 * 2 = 2000 and", GSM, cut=True).answer is None


@pytest.mark.parametrize(
    "completion, strict, lenient",
    [
        # numbered Markdown headings over the steps are not "#### <answer>" lines
        ("#### 1. Eggs left\n16 - 3 - 4 = 9\n#### 2. Money\n9 * 2 = 18\n#### 18", "18", "18"),
        ("#### 1. Eggs left\n16 - 3 - 4 = 9\n#### 2. Money\n9 * 2 = 18", None, "18"),
        ("  #### 3) Total\nIt is 18", None, "18"),
        # an answer line that goes on with words is still the answer
        (" #### 18. I hope it is correct.", "18", "18"),
        ("#### 18. I hope it is correct.\n\n", "18", "18"),
    ],
)
def test_numbered_headings_are_not_the_answer(completion, strict, lenient):
    assert Number().strict(completion, GSM18).answer == strict
    assert Number().lenient(completion, GSM18).answer == lenient
