"""``python -m proj.train TOTAL_EPOCHS SAVE_EVERY [--config PATH]``, from the project root."""

from .report import report

if __name__ == "__main__":
    report(__name__, "module " + __spec__.name)
