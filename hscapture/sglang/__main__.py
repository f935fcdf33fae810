"""``python -m hscapture.sglang <sglang launch_server args>``: see :mod:`.launcher`."""

from .launcher import main

if __name__ == "__main__":
    main()
