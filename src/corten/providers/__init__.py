"""Kernel providers (:mod:`corten.providers.base`): the kernel libraries a C build chooses from."""
from corten.providers.base import (
    FALLBACK,
    Kernel,
    KernelCall,
    KernelProvider,
    KernelStep,
    ParamStruct,
    Provider,
    activation_dtype,
    chain_label,
    choose_provider,
    element_pointer,
    get_provider,
    kernel_suffix,
    op_of,
    provider_names,
    register_provider,
    resolve_providers,
    NodeView,
    nhwc,
    unregister_provider,
    weight_dtype,
)
from corten.providers.cmsis_nn import CMSIS_NN
from corten.providers.portable import PORTABLE

__all__ = ["FALLBACK", "Kernel", "KernelCall", "KernelProvider", "KernelStep", "ParamStruct", "Provider",
           "activation_dtype", "chain_label", "choose_provider", "element_pointer", "get_provider", "kernel_suffix",
           "op_of", "provider_names",
           "register_provider", "resolve_providers", "NodeView", "nhwc", "unregister_provider", "weight_dtype",
           "CMSIS_NN", "PORTABLE"]
