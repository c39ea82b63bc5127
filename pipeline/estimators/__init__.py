"""The scikit-learn style estimators, hyperparameter search and tuning, and model artifacts on
disk. Imports every layer below (``core`` ... ``distributed``).
"""
