# A base with nothing but Debian's python3 venv: pip 23.0, setuptools 66, no `wheel`, no torch.
# The delivery tests build and push the product on it (pushing the 8 GB DLC stand-in would take
# minutes and proves nothing more), and it shows the image build needs none of the base's
# build tools (issue: `invalid command 'bdist_wheel'` on such bases).
ARG BASE=container-entry/debian-bookworm:latest
FROM ${BASE}
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
