"""Weir configurations the suites run, and the credentials they need (JWT with a JWKS file, API keys).

Configurations are written as JSON, which is YAML (Weir reads them with --config).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import time
from dataclasses import dataclass

POOL_DEFAULTS = {
    "timeouts": {"connect": "2s", "first_byte": "120s", "idle": "60s"},
    "max_idle_per_endpoint": 512,
    "idle_keepalive": "4s",
    "eject_for": "2s",
}

# The four pools of config/weir.example.yaml, all chat pools here (the seed workload is chat
# streaming; the example's fourth pool serves embeddings): model -> (pool, upstream_model, aliases).
SEED_MODELS = {
    "llama-3.1-8b-instruct": ("llama", "meta-llama/Llama-3.1-8B-Instruct", ["llama", "llama-8b"]),
    "qwen2.5-7b-instruct": ("qwen", "Qwen/Qwen2.5-7B-Instruct", ["qwen"]),
    "mistral-7b-instruct": ("mistral", "mistralai/Mistral-7B-Instruct-v0.3", []),
    "gemma-2-9b-it": ("gemma", "google/gemma-2-9b-it", ["gemma"]),
}

NEVER_TRIPS = {
    "requests_per_minute": 1_000_000_000,
    "tokens_per_minute": 1_000_000_000_000,
    "max_concurrent_streams": 1_000_000,
    "requests_burst": 1_000_000_000,
    "tokens_burst": 1_000_000_000_000,
}
NEVER_TRIPS_BUDGET = {"usd": 1_000_000_000, "period": "720h"}
PRICING = {"*": {"input": 1.0, "output": 2.0}}

API_KEY = "sk-weir-bench-governed-0123456789abcdef"


# server.access_log value that targets.start_weir replaces by a file of the target's own in the work dir.
# The suites that compare Weir with nginx run Weir with its access log on, as a deployment runs it
# (nginx's own access log stays off: the comparison is against nginx's cheapest hop).
ACCESS_LOG_FILE = "<work dir>/<tag>-access.log"


def plain(mock_url: str, access_log: str = "off") -> dict:
    """One pool, no auth, no limits: the plain proxy hop. `access_log`: server.access_log ("off", "-", a path,
    or ACCESS_LOG_FILE for a file of the target's own)."""
    return {
        "workers": 1,
        "server": {"access_log": access_log},
        "pools": {"mock": {"endpoints": [mock_url], **POOL_DEFAULTS}},
        "models": {"mock-model": {"pool": "mock"}},
        "default_pool": "mock",
    }


def governed(mock_url: str, access_log: str = "off") -> dict:
    """plain() plus an API key, tenant and key rate limits, stream caps and budgets, all set never to trip."""
    cfg = plain(mock_url, access_log)
    cfg["tenants"] = {"bench": {"models": ["*"], "limits": dict(NEVER_TRIPS), "budget": dict(NEVER_TRIPS_BUDGET)}}
    cfg["pricing"] = PRICING
    cfg["auth"] = {
        "required": True,
        "api_keys": [{
            "id": "bench-key",
            "sha256": hashlib.sha256(API_KEY.encode()).hexdigest(),
            "tenant": "bench",
            "limits": dict(NEVER_TRIPS),
            "budget": dict(NEVER_TRIPS_BUDGET),
        }],
    }
    return cfg


def make_jwt(work: pathlib.Path) -> tuple[pathlib.Path, str]:
    """An RS256 key pair: writes WORK/jwks.json, returns (its path, a token for tenant "bench" valid for a day)."""
    import jwt
    from cryptography.hazmat.primitives.asymmetric import rsa
    from jwt.algorithms import RSAAlgorithm

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(RSAAlgorithm.to_jwk(key.public_key()))
    jwk.update({"kid": "bench-1", "alg": "RS256", "use": "sig"})
    path = work / "jwks.json"
    path.write_text(json.dumps({"keys": [jwk]}))
    now = int(time.time())
    token = jwt.encode({"iss": "https://bench.weir.invalid/", "aud": "weir", "sub": "bench-user",
                        "tenant": "bench", "iat": now, "exp": now + 86400},
                       key, algorithm="RS256", headers={"kid": "bench-1"})
    return path, token


@dataclass
class TlsFiles:
    """A throwaway CA and a server certificate it signed (PEM files): what weir-mock's TLS listener serves and
    what Weir's https pool trusts (`pools.P.tls.ca_file`)."""
    ca: pathlib.Path
    cert: pathlib.Path
    key: pathlib.Path


def make_tls(work: pathlib.Path) -> TlsFiles:
    """A self-signed CA and a certificate for 127.0.0.1 (IP SAN) and localhost, both ECDSA P-256 (what a
    certificate authority issues by default today), valid for a day; written to WORK/tls/."""
    import datetime
    import ipaddress
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    d = work / "tls"
    d.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Weir bench throwaway CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "weir-mock")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    out = TlsFiles(ca=d / "ca.pem", cert=d / "server.pem", key=d / "server.key")
    out.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    out.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    out.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return out


def plain_tls(mock_url: str, ca_file: pathlib.Path, access_log: str = "off") -> dict:
    """plain() for an https:// mock: the pool trusts `ca_file` (verification on, as deployed)."""
    cfg = plain(mock_url, access_log)
    cfg["pools"]["mock"]["tls"] = {"ca_file": str(ca_file)}
    return cfg


def all_controls(mock_url: str, jwks_path: pathlib.Path, access_log: str) -> dict:
    """The seed-000 gateway: JWT (cached key set) → tenant lookup → rate limit, stream cap and budget that
    never trip → four pools by model name; access log on."""
    pools = {}
    models = {}
    for name, (pool, upstream, aliases) in SEED_MODELS.items():
        pools[pool] = {"endpoints": [mock_url], **POOL_DEFAULTS}
        models[name] = {"pool": pool, "upstream_model": upstream, "aliases": aliases}
    return {
        "workers": 1,
        "server": {"access_log": access_log},
        "pools": pools,
        "models": models,
        "tenants": {"bench": {"models": ["*"], "limits": dict(NEVER_TRIPS), "budget": dict(NEVER_TRIPS_BUDGET)}},
        "pricing": PRICING,
        "auth": {
            "required": True,
            "jwt": {
                "jwks_file": str(jwks_path),
                "issuer": "https://bench.weir.invalid/",
                "audience": "weir",
                "tenant_claim": "tenant",
                "subject_claim": "sub",
                "require_exp": True,
                "cache_entries": 4096,
            },
        },
    }


def seed_prompt(words: int = 300) -> str:
    """300 deterministic words (≈400 tokens), like weir-bench's built-in seed000 payload."""
    vocab = ("the river runs past the old mill where morning light falls on stone and water while "
             "engineers measure every token that leaves the gateway under load").split()
    return " ".join(vocab[(i * 7 + i // 5) % len(vocab)] for i in range(words))


def chat_body(model: str, max_tokens: int, stream: bool = True, prompt: str | None = None) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": prompt or seed_prompt()}],
            "max_tokens": max_tokens, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body, separators=(",", ":"))
