"""Every SDK client of a process shares one TLS context, and it trusts what the SDK would.

Building a context reads the system's CA certificates (about 80 ms of CPU), so the
providers build it once (`providers.shared_tls_context`). Sharing must not weaken it:
certificates and host names are still checked, against the same authorities as the
context the SDKs build for themselves.
"""

from __future__ import annotations

import ssl

import httpx2

from providers import shared_tls_context
from providers.anthropic import AnthropicLLM
from providers.openai import OpenAILLM


async def test_both_vendors_clients_use_the_one_context() -> None:
    clients = [
        AnthropicLLM(api_key="sk-ant-test", base_url="http://127.0.0.1:9"),
        AnthropicLLM(api_key="sk-ant-test", base_url="http://127.0.0.1:9"),
        OpenAILLM(api_key="sk-test", base_url="http://127.0.0.1:9/v1"),
    ]
    # The SDKs' aiohttp transport keeps the context it was given.
    contexts = {id(llm._client._client._transport.ssl_context) for llm in clients}  # type: ignore[attr-defined]
    assert contexts == {id(shared_tls_context())}


def test_the_shared_context_checks_like_the_sdks_own() -> None:
    shared, own = shared_tls_context(), httpx2.create_ssl_context()
    assert shared.verify_mode == ssl.CERT_REQUIRED and shared.check_hostname
    assert shared.get_ca_certs() == own.get_ca_certs()
    assert shared.minimum_version == own.minimum_version
