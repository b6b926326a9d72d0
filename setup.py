"""LORAC: low-rank prior contrastive pretraining and its transfer (pip install -e .)."""

from setuptools import find_packages, setup

setup(
    name="lorac",
    version="0.1.0",
    description="LORAC self-supervised pretraining, MoCo-M/MoCo-v2 baselines, detectron2 transfer",
    packages=find_packages(include=["pretrain", "pretrain.*", "transfer", "transfer.*"]),
    package_data={"pretrain": ["data/*.txt"]},
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.1",
        "torchvision>=0.16",
        "fvcore>=0.1.5",
        "iopath>=0.1.9",
        "pycocotools>=2.0.6",
        "submitit>=1.5",
        "numpy<2",  # detectron2 (sal-detectron2 0.7.2) pins numpy<2
        "numba>=0.59",  # compiles the CPU nuclear-norm kernel (pretrain/_jacobi.py)
        "pillow>=9",
        "matplotlib>=3.5",
        "tabulate",
        "jinja2",  # the HTML report page (transfer/analysis/report_html.py)
        "tensorboard",
        "scikit-learn>=1.2",
        "tqdm",
    ],
    # detectron2 is not on PyPI: `make venv` runs tools/install_detectron2.py (see README).
    extras_require={"dev": ["pytest>=7", "pytest-timeout", "ruff>=0.6", "pre-commit"]},
)
