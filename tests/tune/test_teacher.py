from __future__ import annotations

import pytest
from transformers import LlamaConfig

from gapprune.tune import DistillConfig, distill
from gapprune.tune.teacher import check_same_vocabulary, resolve_teacher
from tests.tune.helpers import teacher_and_student, text_file


def test_a_teacher_with_another_vocabulary_is_refused(tmp_path):
    _, student, tokenizer = teacher_and_student()
    other, _, _ = teacher_and_student(vocab_size=300)
    with pytest.raises(ValueError, match="300 logits per token, the student 257"):
        distill(student, tokenizer, DistillConfig(data=text_file(tmp_path), seq_len=32, max_steps=1),
                teacher=other, teacher_tokenizer=tokenizer)


def test_a_teacher_tokenizer_with_other_ids_is_refused():
    from tests.evaluate.test_eval_bench import byte_tokenizer

    teacher, student, tokenizer = teacher_and_student()
    shuffled = byte_tokenizer()
    shuffled.add_special_tokens({"additional_special_tokens": ["<other>"]})  # 258 tokens, same logits
    with pytest.raises(ValueError, match="tokenizer differs"):
        check_same_vocabulary(teacher, shuffled, student, tokenizer)
    check_same_vocabulary(teacher, tokenizer, student, tokenizer)  # the same one passes


def test_evaluation_sets_are_refused_as_training_text():
    teacher, student, tokenizer = teacher_and_student()
    for data in ("wikitext2", "self+ptb"):
        with pytest.raises(ValueError, match="evaluation set"):
            distill(student, tokenizer, DistillConfig(data=data, seq_len=32, max_steps=1, cache_dir="unused"),
                    teacher=teacher, teacher_tokenizer=tokenizer)


def test_the_teacher_is_the_recorded_source_else_a_clear_error():
    config = LlamaConfig()
    with pytest.raises(ValueError, match="name the teacher"):
        resolve_teacher(config)
    config.gguf_source = "smollm2-135m"
    assert resolve_teacher(config) == "smollm2-135m"
    config.pruned_from = "org/model"
    assert resolve_teacher(config) == "org/model"
