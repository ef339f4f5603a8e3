"""``python -m torchx_elastic.agent``."""

from torchx_elastic.agent.launcher import main

if __name__ == "__main__":
    main()
