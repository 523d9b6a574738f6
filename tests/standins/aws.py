"""The AWS API stand-in: moto's server mode (pinned in tests/standins/moto-constraints.txt), a real
process on a free port, never the real AWS. tools/setup.sh installs it into a venv of its own (its
botocore and the project's kubernetes client want incompatible python-dateutil versions).

The tests set AWS up and read it back through boto3 in that venv, AWS's own SDK, so what they assert
does not go through the code under test. With `enforce_auth()` moto checks each request's Signature
Version 4 and the caller's IAM policy as AWS does (its `/moto-api/reset-auth`).
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polling import until

CONSTRAINTS = Path(__file__).with_name("moto-constraints.txt")
# the one place the version is written is the pin (tools/setup.sh reads it there too)
MOTO_VERSION = next(
    line.split("==", 1)[1].strip() for line in CONSTRAINTS.read_text().splitlines() if line.startswith("moto==")
)
REGION = "us-west-2"
ZONE = "us-west-2a"
GROUP = "neuron-trn1"


def moto_venv() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "neuron-helm-chart" / "moto" / MOTO_VERSION


def missing() -> list[str]:
    server = moto_venv() / "bin" / "moto_server"
    return [] if server.exists() else [str(server)]


# boto3 in moto's venv, the parameters on stdin as JSON, the answer on stdout as JSON
PRELUDE = """
import json, sys
import boto3
p = json.load(sys.stdin)
def client(name, key="testing", secret="testing"):
    return boto3.client(name, endpoint_url=p["url"], region_name=p["region"], aws_access_key_id=key,
                        aws_secret_access_key=secret)
"""

SETUP = """
ec2, asg, iam = client("ec2"), client("autoscaling"), client("iam")
ami = "ami-12c6146b"  # any id: moto checks AMIs only with MOTO_ENABLE_AMI_VALIDATION (listing them takes seconds)
ec2.create_launch_template(LaunchTemplateName="neuron", LaunchTemplateData={"ImageId": ami, "InstanceType": "trn1.32xlarge"})
asg.create_auto_scaling_group(AutoScalingGroupName=p["group"], LaunchTemplate={"LaunchTemplateName": "neuron"},
                              MinSize=2, MaxSize=3, DesiredCapacity=2, AvailabilityZones=[p["zone"]])
members = [i["InstanceId"] for i in asg.describe_auto_scaling_instances()["AutoScalingInstances"]]
lone = ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, InstanceType="trn1.32xlarge",
                         Placement={"AvailabilityZone": p["zone"]})["Instances"][0]["InstanceId"]
keys = {}
for user, policy in p["users"].items():
    iam.create_user(UserName=user)
    iam.put_user_policy(UserName=user, PolicyName="neuron-remediator", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=user)["AccessKey"]
    keys[user] = [key["AccessKeyId"], key["SecretAccessKey"]]
for role, policy in p["roles"].items():
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Federated": "oidc"},
             "Action": "sts:AssumeRoleWithWebIdentity"}]}
    arn = iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
    iam.put_role_policy(RoleName=role, PolicyName="neuron-remediator", PolicyDocument=json.dumps(policy))
    keys[role] = arn
print(json.dumps({"members": members, "lone": lone, "keys": keys}))
"""

HEALTH = """
key, secret = p["key"]
asg = client("autoscaling", key, secret)
# upper case: AWS documents HEALTHY and UNHEALTHY here, moto answers Healthy and Unhealthy
print(json.dumps({i["InstanceId"]: i["HealthStatus"].upper() for i in asg.describe_auto_scaling_instances()["AutoScalingInstances"]}))
"""

ATTACH = """
key, secret = p["key"]
client("autoscaling", key, secret).attach_instances(InstanceIds=[p["instance"]], AutoScalingGroupName=p["group"])
print("{}")
"""


@dataclass
class Moto:
    url: str
    log: Path
    ca: Path | None = None  # the certificate of an HTTPS server, which boto3 is told to trust

    def boto(self, script: str, **params: Any) -> Any:
        """`script` run with boto3 in moto's venv; what it printed, read as JSON."""
        done = subprocess.run(
            [str(moto_venv() / "bin" / "python"), "-c", PRELUDE + script],
            input=json.dumps({"url": self.url, "region": REGION, **params}),
            env={**os.environ, **({"AWS_CA_BUNDLE": str(self.ca)} if self.ca else {})},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(f"boto3 in moto's venv failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout)

    def setup(self, users: Mapping[str, Any] | None = None, roles: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """An Auto Scaling group of two instances in ZONE, an instance in no group, IAM users (each with
        its policy and an access key) and web-identity roles: {"members", "lone", "keys"}."""
        found: dict[str, Any] = self.boto(
            SETUP, group=GROUP, zone=ZONE, users=dict(users or {}), roles=dict(roles or {})
        )
        return found

    def health(self, key: list[str]) -> dict[str, str]:
        """DescribeAutoScalingInstances as AWS's SDK reads it: instance id -> HealthStatus."""
        found: dict[str, str] = self.boto(HEALTH, key=key)
        return found

    def attach(self, instance: str, key: list[str]) -> None:
        self.boto(ATTACH, instance=instance, group=GROUP, key=key)

    def enforce_auth(self) -> None:
        """From now on moto checks every request's signature and the caller's IAM policy."""
        request = urllib.request.Request(
            f"{self.url}/moto-api/reset-auth", data=b"0", method="POST", headers={"Content-Type": "text/plain"}
        )  # a form body would be read as a form, and the count lost
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200


def self_signed(work: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made with openssl: (cert, key)."""
    cert, key = work / "moto.crt", work / "moto.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


@contextmanager
def moto_server(port: int, work: Path, tls: tuple[Path, Path] | None = None) -> Iterator[Moto]:
    """moto_server on 127.0.0.1:port until the block ends; over HTTPS with `tls` (cert, key)."""
    log = work / "moto.log"
    argv = [str(moto_venv() / "bin" / "moto_server"), "-H", "127.0.0.1", "-p", str(port)]
    if tls is not None:
        argv += ["-c", str(tls[0]), "-k", str(tls[1])]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    moto = Moto(f"{'https' if tls else 'http'}://127.0.0.1:{port}", log, tls[0] if tls else None)
    context = ssl.create_default_context(cafile=str(tls[0])) if tls else None
    try:

        def answering() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"moto_server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{moto.url}/moto-api/data.json", timeout=2, context=context):
                    return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False

        until(answering, f"moto_server answering at {moto.url} (its log: {log})", timeout=60, interval=0.2)
        yield moto
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
