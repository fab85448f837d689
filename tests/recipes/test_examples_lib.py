"""examples/lib.sh's option and cache checks, which every compare.sh relies on: each bad value stops the script
before any training, naming the option."""

import shutil
import subprocess

import pytest
from conftest import REPO


def lib(script: str) -> subprocess.CompletedProcess:
    """Run ``script`` in bash after sourcing examples/lib.sh, with a stub usage and a script's default of 3 seeds."""
    prelude = "source examples/lib.sh; usage() { echo USAGE; }; SEEDS=3; "
    return subprocess.run(["bash", "-c", prelude + script], cwd=REPO, capture_output=True, text=True)


@pytest.mark.parametrize(
    "options, device_args, eval_args",
    [
        ("", "--cpu", "--cpu"),
        ("-d cpu -p bf16", "--cpu --bf16", "--cpu"),
        ("-d cuda", "", ""),
        ("-d cuda -p bf16", "--bf16", ""),
    ],
)
def test_device_and_precision_set_the_arguments(options, device_args, eval_args):
    proc = lib(f'compare_options {options}; echo "[${{DEVICE_ARGS[*]}}] [${{EVAL_DEVICE_ARGS[*]}}]"')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"[{device_args}] [{eval_args}]"


@pytest.mark.parametrize(
    "options, message",
    [
        ("-d gpu", "error: -d gpu: the device is cpu or cuda"),
        ("-p fp16", "error: -p fp16: the precision is fp32 or bf16"),
    ],
)
def test_a_bad_device_or_precision_stops_naming_the_option(options, message):
    proc = lib(f"compare_options {options}; echo reached")
    assert proc.returncode == 2 and message in proc.stderr and "reached" not in proc.stdout


@pytest.mark.parametrize("options, seeds", [("", "1 3"), ("-s 2", "1 2"), ("-s 2-3", "2 3"), ("-s 4-4", "4 4")])
def test_seeds_are_a_count_or_a_range(options, seeds):
    proc = lib(f'compare_options {options}; echo "$FIRST_SEED $LAST_SEED"')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == seeds


@pytest.mark.parametrize("seeds", ["0", "3-2", "2,3", "two", "1-"])
def test_bad_seeds_stop_naming_the_option(seeds):
    proc = lib(f"compare_options -s {seeds}; echo reached")
    assert proc.returncode == 2 and f"error: -s {seeds}:" in proc.stderr and "reached" not in proc.stdout


@pytest.mark.parametrize("options, schedule", [("", "fixed 1"), ("-S fixed", "fixed 1"), ("-S cosine", "cosine 0")])
def test_the_schedule_defaults_to_the_scripts_own_and_cosine_leaves_out_equal_time(options, schedule):
    """-S cosine scores no equal-time point: a checkpoint cut at another model's time is not annealed."""
    proc = lib(f'compare_options {options}; echo "$SCHEDULE $TIMED"')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == schedule


@pytest.mark.parametrize(
    "run_args, expected",
    [
        ("--lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 400", "--lr-period-updates 2600"),
        ("--warmup-updates 150 --warmup-updates 500", "--lr-period-updates 2500"),  # the last, as argparse reads it
        ("--warmup-updates=500", "--lr-period-updates 2500"),
        ("--lr 1e-3", "--lr-period-updates 3000"),  # no warm-up: the cosine spans the run
    ],
)
def test_cosine_keeps_the_warm_up_and_ends_at_the_budget(run_args, expected):
    proc = lib(
        f'compare_options -S cosine; RUN_ARGS=({run_args}); compare_schedule_args 3000; echo "${{SCHEDULE_ARGS[*]}}"'
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"--lr-scheduler cosine {expected} --lr-shrink 0"


def test_the_fixed_schedule_adds_no_arguments_and_a_bad_one_stops_naming_the_flag():
    proc = lib(
        'compare_options; RUN_ARGS=(--warmup-updates 400); compare_schedule_args 300; echo "[${SCHEDULE_ARGS[*]}]"'
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr
    proc = lib("compare_options -S step; echo reached")
    assert proc.returncode == 2 and "error: -S step: the schedule is fixed or cosine" in proc.stderr
    assert "reached" not in proc.stdout


def test_an_unknown_option_prints_the_usage_and_stops():
    proc = lib("compare_options -q; echo reached")
    assert proc.returncode == 2 and "USAGE" in proc.stderr and "reached" not in proc.stdout


def test_equal_size_reuses_its_answer_only_for_the_same_arguments(tmp_path):
    """The cached size answers the arguments it was computed for; other arguments into the same file stop the
    script (another -x into the same OUT) instead of reusing a size computed for another model."""
    cache = tmp_path / "size.txt"
    key = "--arch a --x 1 | 2000000 | --n {} | 4 512 4"
    cache.write_text(f"84\t1999000\n{key}\n")
    same = lib(f'equal_size {cache} 2000000 "--n {{}}" 4 512 4 --arch a --x 1; echo "size $EQUAL_SIZE"')
    assert same.returncode == 0 and same.stdout.strip() == "size 84", same.stderr
    other = lib(f'equal_size {cache} 2000000 "--n {{}}" 4 512 4 --arch a --x 2; echo "size $EQUAL_SIZE"')
    assert other.returncode == 2 and "answers other arguments" in other.stderr and "size" not in other.stdout


def fake_apt_get(tmp_path, package: str, version: str, fail: bool = False):
    """A PATH whose apt-get 'downloads' a real .deb of ``package`` (built here with dpkg-deb) or fails."""
    bin_dir, src = tmp_path / "bin", tmp_path / "src"
    (src / "DEBIAN").mkdir(parents=True)
    (src / "usr" / "share" / "doc" / package).mkdir(parents=True)
    (src / "usr" / "share" / "doc" / package / "text").write_text("hello\n")
    (src / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: {version}\nArchitecture: all\nMaintainer: nobody <nobody@example.org>\n"
        f"Description: a test package\n"
    )
    deb = tmp_path / f"{package}.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(src), str(deb)], check=True, capture_output=True)
    bin_dir.mkdir()
    body = "exit 1" if fail else f'cp {deb} "./{package}_{version}_all.deb"'
    (bin_dir / "apt-get").write_text(f"#!/bin/sh\n{body}\n")
    (bin_dir / "apt-get").chmod(0o755)
    return f"{bin_dir}:/usr/bin:/bin"


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb (Debian, Ubuntu)")
def test_debian_packages_unpacks_and_names_the_versions(tmp_path):
    path = fake_apt_get(tmp_path, "tiny-doc", "1.2-3")
    out = tmp_path / "packages"
    proc = lib(f"PATH={path}; debian_packages {out} tiny-doc")
    assert proc.returncode == 0, proc.stderr
    assert (out / "root" / "usr" / "share" / "doc" / "tiny-doc" / "text").read_text() == "hello\n"
    assert (out / "versions.txt").read_text() == "Package: tiny-doc Version: 1.2-3\n"
    assert not (tmp_path / "packages.tmp").exists()


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb (Debian, Ubuntu)")
def test_a_failed_download_stops_and_leaves_no_packages_folder(tmp_path):
    path = fake_apt_get(tmp_path, "tiny-doc", "1.2-3", fail=True)
    proc = lib(f"PATH={path}; debian_packages {tmp_path / 'packages'} tiny-doc; echo reached")
    assert proc.returncode == 1 and "apt-get download failed" in proc.stderr and "reached" not in proc.stdout
    assert not (tmp_path / "packages").exists()
