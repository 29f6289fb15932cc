"""ART 0.3-0.4's path of the deployment names (`groupwise.utils.deployment`: none reaches a provider)."""

from enum import Enum

from groupwise.art.utils.deployment import (TOGETHER_SUPPORTED_BASE_MODELS, WANDB_SUPPORTED_BASE_MODELS, DeploymentConfig,
                                        DeploymentResult, LoRADeploymentJob, LoRADeploymentProvider, Provider,
                                        TogetherDeploymentConfig, TogetherJobStatus, WandbDeploymentConfig, deploy_model,
                                        deploy_wandb)

__all__ = ["DeploymentConfig", "DeploymentResult", "LoRADeploymentJob", "LoRADeploymentJobStatus",
           "LoRADeploymentProvider", "Provider",
           "TOGETHER_SUPPORTED_BASE_MODELS", "TogetherDeploymentConfig", "TogetherJobStatus",
           "WANDB_SUPPORTED_BASE_MODELS", "WandbDeploymentConfig", "deploy_model", "deploy_wandb"]


class LoRADeploymentJobStatus(str, Enum):  # ART 0.3-0.4's job states
    QUEUED = "Queued"
    RUNNING = "Running"
    COMPLETE = "Complete"
    FAILED = "Failed"
