"""LORAC: low-rank prior contrastive pretraining and its transfer (pip install -e .)."""

from setuptools import find_packages, setup

# Each tool's code is a `main` in pretrain/cli/ or transfer/cli/; tools/*.py wrap the same mains.
TOOLS = {
    "train_pretrain": "pretrain.cli.train_pretrain",
    "submit_pretrain": "pretrain.cli.submit_pretrain",
    "demo": "transfer.cli.demo",
    "study": "transfer.cli.study",
    "convert_to_d2": "transfer.cli.convert_to_d2",
    "export_backbone": "transfer.cli.export_backbone",
    "train_net": "transfer.cli.train_net",
    "collect_detection_results": "transfer.cli.collect_detection_results",
    "linear_probe": "transfer.cli.linear_probe",
    "transfer_linear": "transfer.cli.transfer_linear",
    "svm_voc07": "transfer.cli.svm_voc07",
    "semi_supervised": "transfer.cli.semi_supervised",
    "knn_eval": "transfer.cli.knn_eval",
    "analyze_nuclear_norm": "transfer.cli.analyze_nuclear_norm",
    "make_report": "transfer.cli.make_report",
    "plot_embedding": "transfer.cli.plot_embedding",
}

setup(
    name="lorac",
    version="0.1.0",
    description="LORAC self-supervised pretraining, MoCo-M/MoCo-v2 baselines, detectron2 transfer",
    # configs/ stays at the top of the repository and installs as the package lorac_configs
    # (transfer/shipped_configs.py finds its files there, in editable and regular installs alike).
    packages=[
        *find_packages(include=["pretrain", "pretrain.*", "transfer", "transfer.*"]),
        "lorac_configs",
    ],
    package_dir={"lorac_configs": "configs"},
    package_data={"pretrain": ["data/*.txt"], "lorac_configs": ["**/*.yaml"]},
    entry_points={
        "console_scripts": [
            f"lorac-{name.replace('_', '-')} = {module}:main" for name, module in TOOLS.items()
        ]
    },
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.11",  # the oldest one CI runs (make test-oldest-torch)
        "torchvision>=0.26",  # torch 2.11's
        "fvcore>=0.1.5",
        "iopath>=0.1.9",
        "pycocotools>=2.0.6",
        "submitit>=1.5",
        "numpy<2",  # detectron2 (sal-detectron2 0.7.2) pins numpy<2
        "pillow>=9",
        "matplotlib>=3.5",
        "tabulate",
        "jinja2",  # the HTML report page (transfer/analysis/report_html.py)
        "tensorboard",
        "scikit-learn>=1.2",
        "tqdm",
        "safetensors>=0.4",  # tools/export_backbone.py --safetensors
        "timm>=0.9",  # tools/export_backbone.py --format timm checks the file against timm
        # detectron2's LVIS and Cityscapes loaders and evaluators (configs/lvis_*, cityscapes_*):
        "lvis>=0.5.3",  # LVISEvaluator (lvis-api)
        "cityscapesscripts>=2.2",  # Cityscapes labels, CityscapesInstance/SemSegEvaluator
        "shapely>=2.0",  # the Cityscapes instance loader reads the polygon JSON with it
        "opencv-python-headless>=4.8,<4.12",  # cv2 for both; 4.12 wheels need numpy>=2
    ],
    # detectron2 is not on PyPI: `make venv` runs tools/install_detectron2.py (see README).
    extras_require={
        # wandb and mlflow-skinny: the optional --log-to writers, installed so that their tests run
        "dev": [
            "pytest>=7",
            "pytest-timeout",
            "pytest-xdist>=3",
            "ruff>=0.6",
            "pre-commit",
            "wandb>=0.19.10",  # wandb.init(reinit="create_new")
            "mlflow-skinny",
        ]
    },
)
