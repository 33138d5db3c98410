"""Unit tests of plan/secrets.py: which settings are secrets and how they are masked."""

from __future__ import annotations

import pytest

from orchestrator.plan.secrets import MASK, is_secret, mask_cluster_text, mask_env, secret_values


@pytest.mark.parametrize("name,value,secret", [
    ("HF_TOKEN", "hf_abcdefghijklmnop", True),
    ("WANDB_API_KEY", "not-a-real-key", True),
    ("DB_PASSWORD", "hunter2-value", True),
    ("TOKENIZERS_PARALLELISM", "false", False),   # every Hugging Face project sets it
    ("TOKENIZERS_PARALLELISM", "true", False),
    ("USE_AUTH_TOKEN", "disabled", False),          # a setting word, however long
    ("KEY_SIZE", "4096", False),                    # short, and a number
    ("SECRET_SEED", "1234567890", False),           # a number
    ("CACHE_KEY", "abc", False),                    # too short to be a credential
    ("PATH", "/usr/local/bin:/usr/bin", False),     # not a secret-looking name
])
def test_a_secret_is_a_secret_name_with_a_credential_like_value(name, value, secret):
    assert is_secret(name, value) is secret
    env = {name: value}
    assert (mask_env(env)[name] == MASK) is secret
    assert secret_values(env) == ((value.encode(),) if secret else ())


def test_the_stored_cluster_file_masks_secrets_and_keeps_settings_readable():
    text = ('env:\n  TOKENIZERS_PARALLELISM: "false"\n  HF_TOKEN: hf_abcdefghijklmnop\n'
            'nodes:\n  - host: a\n    env: {API_KEY: "k3y-value-42", KEY_SIZE: 4096}\n')
    masked = mask_cluster_text(text)
    assert 'TOKENIZERS_PARALLELISM: "false"' in masked and "KEY_SIZE: 4096" in masked
    assert "hf_abcdefghijklmnop" not in masked and "k3y-value-42" not in masked
    assert masked.count(MASK) == 2


# The rule as docs/secrets.md and secrets.py's docstring
# promise it, written out as literal cases (the expected answer is never
# computed by the code under test): a name holding TOKEN, SECRET, PASSWORD,
# PASSWD, KEY or CREDENTIAL (any case, anywhere in the name) and a value of
# at least 8 characters that is neither a number nor a settings word.
RULE_TABLE = [
    # every name pattern, at the start, in the middle, at the end, any case
    ("HF_TOKEN", "hf_abcdefgh", True),
    ("TOKEN", "abcdefgh", True),
    ("token_for_hub", "abcdefgh", True),
    ("MY_SECRET", "abcdefgh", True),
    ("secret", "abcdefgh", True),
    ("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG", True),
    ("DB_PASSWORD", "hunter2hunter2", True),
    ("Password", "abcdefgh", True),
    ("PGPASSWD", "abcdefgh", True),          # PASSWD is not a part of PASSWORD
    ("MYSQL_PASSWD_FILE", "abcdefgh", True),
    ("passwd", "abcdefgh", True),
    ("WANDB_API_KEY", "abcdefgh", True),
    ("KEYRING", "abcdefgh", True),
    ("ssh_key", "abcdefgh", True),
    ("AWS_CREDENTIALS", "abcdefgh", True),
    ("GOOGLE_APPLICATION_CREDENTIAL_JSON", "abcdefgh", True),
    ("credential", "abcdefgh", True),
    # names that look like none of them
    ("PATH", "/usr/local/bin:/usr/bin", False),
    ("PASSWORT", "abcdefgh", False),        # German: no PASSWORD, no PASSWD
    ("PASS", "abcdefgh", False),
    ("TOKE_N", "abcdefgh", False),
    ("K_E_Y", "abcdefgh", False),
    ("SECRE", "abcdefgh", False),
    ("CREDENTIA", "abcdefgh", False),
    ("MONKEY_PATCH", "abcdefgh", True),     # holds KEY: the rule is a substring rule
    # the 7/8-character boundary
    ("HF_TOKEN", "abcdefg", False),
    ("HF_TOKEN", "abcdefgh", True),
    ("HF_TOKEN", "a2c4e6g", False),
    ("HF_TOKEN", "a2c4e6g8", True),
    ("HF_TOKEN", "", False),
    ("PGPASSWD", "s3cr3t!", False),
    ("PGPASSWD", "s3cr3t!!", True),
    ("HF_TOKEN", "       x", True),         # 8 characters, spaces count
    # numbers: a port, a size, a seed, a float
    ("SECRET_SEED", "12345678", False),
    ("API_KEY", "1234567890123", False),
    ("API_KEY", "-1234567", False),
    ("API_KEY", "3.141592653", False),
    ("API_KEY", "1.5e+100", False),
    ("API_KEY", "12345678x", True),         # not a number
    ("API_KEY", "0x1234567", True),         # hex is not a float
    # settings words: only those of 8 characters or more matter, and any case
    # or surrounding blanks
    ("USE_AUTH_TOKEN", "disabled", False),
    ("USE_AUTH_TOKEN", "DISABLED", False),
    ("USE_AUTH_TOKEN", "required", False),
    ("USE_AUTH_TOKEN", "optional", False),
    ("USE_AUTH_TOKEN", "  false  ", False),
    ("USE_AUTH_TOKEN", "   enabled", False),
    ("USE_AUTH_TOKEN", "  default ", False),
    ("USE_AUTH_TOKEN", "    auto", False),
    ("USE_AUTH_TOKEN", "  True  ", False),
    ("USE_AUTH_TOKEN", "disabledx", True),  # a word of settings, then more
    ("USE_AUTH_TOKEN", "not-false", True),
    ("TOKENIZERS_PARALLELISM", "false", False),
]


@pytest.mark.parametrize("name,value,secret", RULE_TABLE)
def test_the_secret_rule_table(name, value, secret):
    assert is_secret(name, value) is secret
    assert mask_env({name: value, "PLAIN": value}) == (
        {name: "********", "PLAIN": value} if secret else {name: value, "PLAIN": value})
    assert secret_values({name: value}) == ((value.encode(),) if secret else ())


def test_the_mask_is_eight_stars():
    assert MASK == "********"


def test_secret_values_are_the_secrets_only_longest_first_and_once():
    env = {"HF_TOKEN": "abcdefgh", "PGPASSWD": "abcdefghijkl", "DB_PASSWORD": "abcdefgh",
           "TOKENIZERS_PARALLELISM": "false", "PROJECT": "abcdefghijklmnop",
           "API_KEY": "12345678", "MY_SECRET": "zz"}
    assert secret_values(env) == (b"abcdefghijkl", b"abcdefgh")


def test_scrub_masks_every_secret_the_longest_first():
    from orchestrator.plan.secrets import scrub

    line = b"token abcdefghijkl and abcdefgh, again abcdefgh; abcdefg stays\n"
    assert scrub(line, (b"abcdefghijkl", b"abcdefgh")) == (
        b"token ******** and ********, again ********; abcdefg stays\n")
    assert scrub(line, ()) == line
