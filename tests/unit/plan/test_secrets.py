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
