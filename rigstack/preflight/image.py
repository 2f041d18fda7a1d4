"""The image a docker profile runs: present in the local daemon, built from this stack, its laid files intact
(rigstack.rigimages.verify_image); or, in bind-mount mode, the base present and the mounted package on this stack."""

from __future__ import annotations

from pathlib import Path

from rigstack.errors import UserError
from rigstack.preflight.core import Context, Result, check, fail, passed, skip
from rigstack.stamp import read_stamp


@check("image")
def image(ctx: Context) -> Result:
    from rigstack import dockerapi, rigimages  # only docker profiles need the docker SDK

    profile = ctx.profile
    if not profile.image:
        return skip("the profile runs on this host (no image:)")
    build = f"python -m rigstack.images build --profile {profile.name}"
    try:
        client = dockerapi.connect()
    except UserError:
        return fail(f"no docker daemon is reachable to check image {profile.image}",
                    "start dockerd (`dockerd > /var/log/dockerd.log 2>&1 &` or `systemctl start docker`), "
                    "then rerun preflight")
    try:
        dockerapi.local_image(client, profile.image)
    except UserError:
        fix = ("pull or import the base image it names" if profile.docker.bind_package else build)
        return fail(f"image {profile.image} is not present locally", fix)
    if profile.docker.bind_package:
        return _bind_package(ctx, Path(profile.docker.bind_package))
    report = rigimages.verify_image(profile.image)
    if not report.ok:
        first = report.failures[0]
        return fail(f"image {profile.image}: {first.name}: {first.detail.split('; rebuild')[0]}", build)
    laid = sum(item.name.startswith("vllm/") for item in report.checks)
    return passed(f"image {profile.image} verified: built from stack {ctx.stack.stack_hash[:19]}, {laid} laid "
                  "file(s) intact")


def _bind_package(ctx: Context, package: Path) -> Result:
    """The mounted package must be on this stack, and mountable without shadowing the base's compiled files."""
    from rigstack import rigimages

    apply = f"python apply.py apply --from dir:{package}"
    found = read_stamp(package) if (package / "__init__.py").is_file() else None
    if found is None:
        return fail(f"docker.bind_package {package} is not a package patched by rigstack (no stamp)", apply)
    if found.stack_hash != ctx.stack.stack_hash:
        return fail(f"docker.bind_package {package} is stamped with another stack ({found.stack_hash[:19]}), "
                    f"patches/ is {ctx.stack.stack_hash[:19]}", apply)
    mounts = rigimages.bind_mounts(package)  # a UserError (a .so, a folder) becomes this check's FAIL
    return passed(f"image {ctx.profile.image} present; {len(mounts) // 2} changed file(s) of {package} mounted "
                  f"over its package, stack {found.stack_hash[:19]}")
