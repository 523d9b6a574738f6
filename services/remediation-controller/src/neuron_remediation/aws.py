"""AWS's Query API over aiohttp: Signature Version 4, the credentials of a pod (IRSA, EKS Pod Identity,
or keys in the environment), and the region and instance of a Node from its `spec.providerID`.

Written on the standard library rather than botocore: botocore requires python-dateutil<3 and the
kubernetes client, which the project's libraries install, requires >=3, so the two cannot share the
image. The controller makes two calls (Auto Scaling's DescribeAutoScalingInstances and
SetInstanceHealth) and, for IRSA, STS's AssumeRoleWithWebIdentity, all in the Query protocol, whose
whole surface is a signed form POST and an XML answer. The tests hold the signature to AWS's
published example and to moto, which checks it as AWS does.

Credentials, in the AWS SDKs' order (the ones a pod can have):
1. `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (/ `AWS_SESSION_TOKEN`);
2. IRSA: `AWS_ROLE_ARN` and `AWS_WEB_IDENTITY_TOKEN_FILE`, exchanged through STS
   AssumeRoleWithWebIdentity (the token file is read again at each exchange: the kubelet rotates it);
3. EKS Pod Identity (or ECS): `AWS_CONTAINER_CREDENTIALS_FULL_URI` (or `..._RELATIVE_URI`) with
   `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE` (or `..._TOKEN`).
The node's instance profile (IMDS) is deliberately not read: it would give every pod on the node the
right to mark instances Unhealthy; the controller has a role of its own.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import hmac
import json
import re
import time
import urllib.parse
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp

# `aws:///<zone>/<instance id>` (the cloud provider's form; some clusters write `aws://<zone>/...`)
PROVIDER_ID = re.compile(r"^aws://[^/]*/(?P<zone>[a-z0-9-]*)/(?P<instance>i-[0-9a-f]+)$")
# a zone's region: us-west-2a, us-west-2-lax-1a (a Local Zone), us-east-1-wl1-bos-wlz-1 (Wavelength),
# us-gov-west-1a, cn-north-1a
ZONE_REGION = re.compile(r"^(?P<region>[a-z]{2}(?:-gov|-iso[a-z]?)?-[a-z]+-\d+)")
CONTAINER_HOST = "http://169.254.170.2"  # where ..._RELATIVE_URI is relative to (ECS)
REFRESH_BEFORE = 300.0  # temporary credentials are fetched again this long before they expire
ALGORITHM = "AWS4-HMAC-SHA256"


class AwsError(Exception):
    """A call that did not succeed; `code` is AWS's error code, or what went wrong on the way."""

    def __init__(self, code: str, message: str, status: int = 0) -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code, self.message, self.status = code, message, status


class Unreachable(AwsError):
    """No answer: the endpoint refused the connection, timed out, or is not an endpoint at all."""


@dataclass(frozen=True)
class Instance:
    id: str
    zone: str

    @property
    def region(self) -> str:
        return region_of_zone(self.zone)


def instance_of(provider_id: str) -> Instance | None:
    match = PROVIDER_ID.match(provider_id.strip())
    return Instance(match["instance"], match["zone"]) if match else None


def region_of_zone(zone: str) -> str:
    match = ZONE_REGION.match(zone)
    return match["region"] if match else ""


def default_endpoint(service: str, region: str) -> str:
    suffix = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"https://{service}.{region}.{suffix}"


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str
    token: str = ""
    expires: float | None = None  # Unix time; None: static keys
    source: str = "environment"


# -- Signature Version 4 -------------------------------------------------------------------------
def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    key = _hmac(f"AWS4{secret}".encode(), date)
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    return key


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="-_.~")


def canonical_query(query: str) -> str:
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    return "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(pairs))


def sign(
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    credentials: Credentials,
    region: str,
    service: str,
    now: dt.datetime,
) -> dict[str, str]:
    """`headers` with Host, X-Amz-Date, the session token and Authorization added: the request signed
    over every header it carries (AWS's "Signature Version 4 signing process")."""
    parts = urllib.parse.urlsplit(url)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    out = {"Host": parts.netloc, **headers, "X-Amz-Date": amz_date}
    if credentials.token:
        out["X-Amz-Security-Token"] = credentials.token
    canonical = {k.lower(): " ".join(v.split()) for k, v in out.items()}
    signed = ";".join(sorted(canonical))
    request = "\n".join(
        [
            method,
            urllib.parse.quote(parts.path or "/", safe="/-_.~"),
            canonical_query(parts.query),
            "".join(f"{k}:{canonical[k]}\n" for k in sorted(canonical)),
            signed,
            hashlib.sha256(body).hexdigest(),
        ]
    )
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    to_sign = "\n".join([ALGORITHM, amz_date, scope, hashlib.sha256(request.encode()).hexdigest()])
    key = signing_key(credentials.secret_key, amz_date[:8], region, service)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out["Authorization"] = (
        f"{ALGORITHM} Credential={credentials.access_key}/{scope}, SignedHeaders={signed}, Signature={signature}"
    )
    return out


# -- XML answers ----------------------------------------------------------------------------------
def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def find(element: ET.Element, *path: str) -> ET.Element | None:
    """The first descendant along `path` by local name (the Query API's answers carry a namespace)."""
    node: ET.Element | None = element
    for name in path:
        if node is None:
            return None
        node = next((c for c in node.iter() if c is not node and _local(c.tag) == name), None)
    return node


def text(element: ET.Element | None, *path: str) -> str:
    found = find(element, *path) if element is not None else None
    return (found.text or "").strip() if found is not None else ""


def members(element: ET.Element | None, *path: str) -> list[ET.Element]:
    found = find(element, *path) if element is not None else None
    return [c for c in found if _local(c.tag) == "member"] if found is not None else []


def parse_answer(status: int, body: bytes) -> ET.Element:
    """The answer's XML, or the AwsError its ErrorResponse says."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        raise AwsError(f"HTTP{status}", f"not an AWS answer: {body[:200]!r}", status) from None
    if status >= 300 or _local(root.tag) == "ErrorResponse":
        error = find(root, "Error")
        raise AwsError(text(error, "Code") or f"HTTP{status}", text(error, "Message"), status)
    return root


# -- credentials ----------------------------------------------------------------------------------
class CredentialChain:
    """The pod's AWS credentials (the order in the module's docstring), fetched again before expiry."""

    def __init__(self, environ: Mapping[str, str], session: aiohttp.ClientSession, sts_endpoint: str = "") -> None:
        self.environ, self.session, self.sts_endpoint = environ, session, sts_endpoint
        self.cached: Credentials | None = None
        self.lock = asyncio.Lock()

    def source(self) -> str:
        e = self.environ
        if e.get("AWS_ACCESS_KEY_ID") and e.get("AWS_SECRET_ACCESS_KEY"):
            return "environment"
        if e.get("AWS_ROLE_ARN") and e.get("AWS_WEB_IDENTITY_TOKEN_FILE"):
            return "web identity (IRSA)"
        if e.get("AWS_CONTAINER_CREDENTIALS_FULL_URI") or e.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
            return "container credentials (EKS Pod Identity)"
        return ""

    async def get(self, region: str) -> Credentials:
        async with self.lock:
            c = self.cached
            if c is not None and (c.expires is None or c.expires - REFRESH_BEFORE > time.time()):
                return c
            self.cached = await self._fetch(region)
            return self.cached

    async def _fetch(self, region: str) -> Credentials:
        e = self.environ
        source = self.source()
        if source == "environment":
            return Credentials(e["AWS_ACCESS_KEY_ID"], e["AWS_SECRET_ACCESS_KEY"], e.get("AWS_SESSION_TOKEN", ""))
        if source.startswith("web identity"):
            return await self._web_identity(region)
        if source.startswith("container"):
            return await self._container()
        raise AwsError(
            "NoCredentials",
            "no AWS credentials: give the controller's ServiceAccount an IAM role (IRSA: the annotation "
            "eks.amazonaws.com/role-arn; or an EKS Pod Identity association), or set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY",
        )

    def _sts(self, region: str) -> str:
        e = self.environ
        explicit = self.sts_endpoint or e.get("AWS_ENDPOINT_URL_STS") or e.get("AWS_ENDPOINT_URL")
        if explicit:
            return explicit
        if e.get("AWS_STS_REGIONAL_ENDPOINTS") == "legacy" or not region:
            return "https://sts.amazonaws.com"
        return default_endpoint("sts", region)

    async def _web_identity(self, region: str) -> Credentials:
        e = self.environ
        token = await asyncio.to_thread(_token, e["AWS_WEB_IDENTITY_TOKEN_FILE"], "WebIdentityToken")
        form = {
            "Action": "AssumeRoleWithWebIdentity",
            "Version": "2011-06-15",
            "RoleArn": e["AWS_ROLE_ARN"],
            "RoleSessionName": e.get("AWS_ROLE_SESSION_NAME") or f"neuron-remediator-{int(time.time())}",
            "WebIdentityToken": token,
        }
        root = await post_form(self.session, self._sts(region), form, {})  # unsigned: the token is the proof
        c = find(root, "Credentials")
        return Credentials(
            text(c, "AccessKeyId"),
            text(c, "SecretAccessKey"),
            text(c, "SessionToken"),
            _expiry(text(c, "Expiration")),
            "web identity (IRSA)",
        )

    async def _container(self) -> Credentials:
        e = self.environ
        url = (
            e.get("AWS_CONTAINER_CREDENTIALS_FULL_URI") or CONTAINER_HOST + e["AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"]
        )
        headers: dict[str, str] = {}
        token = e.get("AWS_CONTAINER_AUTHORIZATION_TOKEN", "")
        if e.get("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"):
            token = await asyncio.to_thread(_token, e["AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"], "ContainerToken")
        if token:
            headers["Authorization"] = token
        try:
            async with self.session.get(url, headers=headers) as response:
                body = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Unreachable("ContainerCredentials", f"{url}: {exc or type(exc).__name__}") from None
        if status != 200:
            raise AwsError("ContainerCredentials", f"{url} answered {status}: {body[:200]!r}", status)
        try:
            data = json.loads(body)
            return Credentials(
                data["AccessKeyId"],
                data["SecretAccessKey"],
                data.get("Token", ""),
                _expiry(str(data.get("Expiration") or "")),
                "container credentials (EKS Pod Identity)",
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise AwsError("ContainerCredentials", f"{url}: not credentials ({exc})") from None


def _token(path: str, what: str) -> str:
    """A projected token, read at each exchange: the kubelet rotates the file."""
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise AwsError(what, f"cannot read {path}: {exc}") from None


def _expiry(text: str) -> float | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# -- calls ----------------------------------------------------------------------------------------
FORM = "application/x-www-form-urlencoded; charset=utf-8"


async def _post(session: aiohttp.ClientSession, url: str, body: bytes, headers: Mapping[str, str]) -> ET.Element:
    try:
        async with session.post(url, data=body, headers=dict(headers)) as response:
            payload = await response.read()
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise Unreachable("Unreachable", f"{url}: {exc or type(exc).__name__}") from None
    return parse_answer(status, payload)


async def post_form(
    session: aiohttp.ClientSession, endpoint: str, form: Mapping[str, str], headers: Mapping[str, str]
) -> ET.Element:
    """One Query API action, unsigned (STS's AssumeRoleWithWebIdentity)."""
    return await _post(session, endpoint, urllib.parse.urlencode(form).encode(), {"Content-Type": FORM, **headers})


async def call(
    session: aiohttp.ClientSession,
    endpoint: str,
    service: str,
    region: str,
    credentials: Credentials,
    form: Mapping[str, str],
) -> ET.Element:
    """One Query API action, signed."""
    url = endpoint if urllib.parse.urlsplit(endpoint).path else endpoint.rstrip("/") + "/"
    body = urllib.parse.urlencode(form).encode()
    headers = sign("POST", url, {"Content-Type": FORM}, body, credentials, region, service, dt.datetime.now(dt.UTC))
    return await _post(session, url, body, headers)
