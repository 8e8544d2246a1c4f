#!/bin/sh
# Stand-in for ssh in tests/test_launch.py: skips ssh's options and the host, then
# runs the remote command line in a new session, outside the launcher's process
# groups, as sshd would on another machine.
while [ $# -gt 0 ]; do
    case "$1" in
        -o|-p) shift 2 ;;
        -*) shift ;;
        *) break ;;
    esac
done
shift   # the host
exec setsid -w sh -c "$*"
