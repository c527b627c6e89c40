#!/bin/sh
# Last command of every Dockerfile RUN that installs packages or adds users:
# remove what records the build rather than the image, so that two builds of
# the same commit give the same layer (train/container/reproducible.py clamps
# the timestamps; this removes the files whose content is the build itself).
#   apt/dpkg logs and the previous versions of dpkg's and debconf's databases;
#   apt's binary package caches (rebuilt by the next apt-get update);
#   ldconfig's aux-cache (inode numbers and ctimes of the libraries it read);
#   gpg's home (its trust database records when it was created).
set -eu
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/ldconfig/aux-cache \
  /var/log/apt/* /var/log/dpkg.log /var/log/alternatives.log \
  /var/lib/dpkg/*-old /var/cache/debconf/*-old /root/.gnupg
