class LinearBase:
    def __init__(self, input_size, output_size, skip_bias_add=False, params_dtype=None, quant_config=None):
        self.input_size = input_size


class ReplicatedLinear(LinearBase):
    pass


class RowParallelLinear(LinearBase):
    def __init__(self, input_size, output_size, bias=True, params_dtype=None, quant_config=None, *, disable_tp=False):
        super().__init__(input_size, output_size, params_dtype=params_dtype, quant_config=quant_config)
